#include "store_protocol.h"

#include <charconv>
#include <cstdint>
#include <cstdio>

#include "tandem/store.h"

namespace tandem::store_protocol {
namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

bool is_request(uint16_t opcode) {
  return opcode >= static_cast<uint16_t>(Op::set) && opcode <= static_cast<uint16_t>(Op::auth);
}

bool is_response(uint16_t opcode) {
  return opcode >= static_cast<uint16_t>(Op::ok) && opcode <= static_cast<uint16_t>(Op::error);
}

const char* op_name(uint16_t opcode) {
  switch (static_cast<Op>(opcode)) {
    case Op::set: return "set";
    case Op::get: return "get";
    case Op::try_get: return "try_get";
    case Op::add: return "add";
    case Op::wait: return "wait";
    case Op::check: return "check";
    case Op::erase: return "delete";
    case Op::hello: return "hello";
    case Op::goodbye: return "goodbye";
    case Op::heartbeat: return "heartbeat";
    case Op::auth_begin: return "auth_begin";
    case Op::auth: return "auth";
    case Op::ok: return "ok";
    case Op::value: return "value";
    case Op::not_found: return "not_found";
    case Op::error: return "error";
  }
  return "unknown";
}

void append_frame(std::string& out, Op op, std::string_view key, std::string_view value) {
  out.reserve(out.size() + kHeaderBytes + key.size() + value.size());
  put_le(out, kStoreMagic, 4);
  put_le(out, kStoreVersion, 2);
  put_le(out, static_cast<uint16_t>(op), 2);
  put_le(out, key.size(), 4);
  put_le(out, value.size(), 4);
  out.append(key);
  out.append(value);
}

std::string encode_frame(Op op, std::string_view key, std::string_view value) {
  std::string out;
  append_frame(out, op, key, value);
  return out;
}

Header decode_header(const void* bytes) {
  auto* p = static_cast<const unsigned char*>(bytes);
  Header h;
  h.magic = static_cast<uint32_t>(get_le(p, 4));
  h.version = static_cast<uint16_t>(get_le(p + 4, 2));
  h.opcode = static_cast<uint16_t>(get_le(p + 6, 2));
  h.key_bytes = static_cast<uint32_t>(get_le(p + 8, 4));
  h.value_bytes = static_cast<uint32_t>(get_le(p + 12, 4));
  return h;
}

std::optional<std::string> validate_header(const Header& h, bool expect_request) {
  char buf[160];
  if (h.magic != kStoreMagic) {
    std::snprintf(buf, sizeof buf, "bad magic 0x%08x (expected 0x%08x)", h.magic, kStoreMagic);
    return std::string(buf);
  }
  if (h.version != kStoreVersion) {
    std::snprintf(buf, sizeof buf, "unsupported protocol version %u (expected %u)", unsigned{h.version},
                  unsigned{kStoreVersion});
    return std::string(buf);
  }
  if (expect_request ? !is_request(h.opcode) : !is_response(h.opcode)) {
    std::snprintf(buf, sizeof buf, "unknown %s opcode %u", expect_request ? "request" : "response", unsigned{h.opcode});
    return std::string(buf);
  }
  if (h.key_bytes > kMaxKeyBytes) {
    std::snprintf(buf, sizeof buf, "key length %u exceeds the limit of %u bytes", h.key_bytes, kMaxKeyBytes);
    return std::string(buf);
  }
  if (h.value_bytes > kMaxValueBytes) {
    std::snprintf(buf, sizeof buf, "value length %u exceeds the limit of %u bytes", h.value_bytes, kMaxValueBytes);
    return std::string(buf);
  }
  return std::nullopt;
}

Scan scan_frame(std::string_view buffer, bool expect_request) {
  Scan s;
  if (buffer.size() < kHeaderBytes) return s;
  s.header = decode_header(buffer.data());
  if (auto why = validate_header(s.header, expect_request)) {
    s.kind = Scan::broken;
    s.error = std::move(*why);
    return s;
  }
  // validate_header capped both lengths, so frame_bytes() cannot overflow.
  if (buffer.size() < s.header.frame_bytes()) return s;
  s.kind = Scan::complete;
  s.key = buffer.substr(kHeaderBytes, s.header.key_bytes);
  s.value = buffer.substr(kHeaderBytes + s.header.key_bytes, s.header.value_bytes);
  return s;
}

std::optional<HeartbeatValue> parse_heartbeat(std::string_view value, int64_t max_interval_ms) {
  const auto colon = value.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto r = parse_int64(value.substr(0, colon));
  auto ms = parse_int64(value.substr(colon + 1));
  if (!r || *r < 0 || *r > INT32_MAX || !ms || *ms <= 0 || *ms > max_interval_ms) return std::nullopt;
  return HeartbeatValue{static_cast<int>(*r), *ms};
}

void append_u64(std::string& out, uint64_t v) { put_le(out, v, 8); }

std::optional<uint64_t> read_u64(std::string_view bytes) {
  if (bytes.size() < 8) return std::nullopt;
  return get_le(reinterpret_cast<const unsigned char*>(bytes.data()), 8);
}

std::string encode_key_list(const std::vector<std::string>& keys) {
  std::string out;
  put_le(out, keys.size(), 4);
  for (const auto& k : keys) {
    put_le(out, k.size(), 4);
    out.append(k);
  }
  return out;
}

std::optional<std::vector<std::string>> decode_key_list(std::string_view bytes) {
  auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), pos = 0;
  if (n < 4) return std::nullopt;
  uint64_t count = get_le(p, 4);
  pos = 4;
  // Each key needs at least its 4-byte length, which bounds count before we reserve.
  if (count > (n - pos) / 4) return std::nullopt;
  std::vector<std::string> keys;
  keys.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (n - pos < 4) return std::nullopt;
    uint64_t len = get_le(p + pos, 4);
    pos += 4;
    if (len > kMaxKeyBytes || len > n - pos) return std::nullopt;
    keys.emplace_back(bytes.substr(pos, len));
    pos += len;
  }
  if (pos != n) return std::nullopt;
  return keys;
}

std::optional<int64_t> parse_int64(std::string_view text) {
  int64_t v = 0;
  if (text.empty()) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace tandem::store_protocol
