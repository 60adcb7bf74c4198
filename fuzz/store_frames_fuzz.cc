// Fuzz target: the store's frame parser and every payload decoder, fed a byte
// stream as a connection would deliver it (requests) and as a client would
// receive it (responses). Checks what the server relies on: a complete frame
// lies inside the buffer, a key list that decodes re-encodes to the same
// bytes, integers print back to their text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rendezvous/store_protocol.h"
#include "tandem/store.h"

namespace sp = tandem::store_protocol;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void decode_payload(const sp::Scan& f) {
  const std::string_view value = f.value;
  switch (static_cast<sp::Op>(f.header.opcode)) {
    case sp::Op::get: check(sp::read_u64(value).has_value() == (value.size() >= 8)); break;
    case sp::Op::wait:
      if (value.size() >= 8) {
        if (auto keys = sp::decode_key_list(value.substr(8))) check(sp::encode_key_list(*keys) == value.substr(8));
      }
      break;
    case sp::Op::check:
      if (auto keys = sp::decode_key_list(value)) {
        check(sp::encode_key_list(*keys) == value);
        for (const auto& k : *keys) check(k.size() <= tandem::kMaxKeyBytes);
      }
      break;
    case sp::Op::add:
    case sp::Op::hello:
      if (auto v = sp::parse_int64(value))
        check(std::to_string(*v) == value || value.front() == '0' || value.substr(0, 2) == "-0");
      break;
    case sp::Op::heartbeat:
      if (auto beat = sp::parse_heartbeat(value, 1000000)) check(beat->rank >= 0 && beat->interval_ms > 0);
      break;
    default: break;
  }
}

void scan_stream(std::string_view stream, bool requests) {
  while (true) {
    sp::Scan f = sp::scan_frame(stream, requests);
    if (f.kind != sp::Scan::complete) {
      if (f.kind == sp::Scan::broken) check(!f.error.empty());
      return;
    }
    check(f.header.frame_bytes() <= stream.size());
    check(f.key.size() == f.header.key_bytes && f.value.size() == f.header.value_bytes);
    check(f.key.size() <= tandem::kMaxKeyBytes && f.value.size() <= tandem::kMaxValueBytes);
    // What the server parsed, re-encoded, is the frame it read.
    check(sp::encode_frame(static_cast<sp::Op>(f.header.opcode), f.key, f.value) ==
          stream.substr(0, f.header.frame_bytes()));
    if (requests) decode_payload(f);
    stream.remove_prefix(f.header.frame_bytes());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  scan_stream(bytes, /*requests=*/true);
  scan_stream(bytes, /*requests=*/false);
  // The payload decoders on raw bytes too (a fuzzer rarely builds a valid header first).
  if (auto keys = sp::decode_key_list(bytes)) check(sp::encode_key_list(*keys) == bytes);
  sp::parse_int64(bytes);
  sp::parse_heartbeat(bytes, 1000000);
  return 0;
}
