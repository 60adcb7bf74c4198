// Frame encoding shared by the store server and client (see tandem/store.h for
// the wire format). Pure byte manipulation: no sockets, no Asio.
//
// Payload conventions per opcode (all integers little-endian):
//   SET      key, value
//   GET      key, value = u64 server-side wait in ms (the client's remaining time)
//   TRY_GET  key
//   ADD      key, value = int64 delta as decimal text; reply VALUE = new total as decimal text
//   WAIT     value = u64 wait in ms, then a key list
//   CHECK    value = key list; reply OK if all exist, NOT_FOUND otherwise
//   DELETE   key
//   HELLO    value = rank as decimal text
//   GOODBYE  (empty)
//   HEARTBEAT value = "<rank>:<interval ms>"; registers the connection as that
//            rank's (as HELLO) and says it will beat at least every interval
//   AUTH_BEGIN (empty); VALUE reply = this connection's nonce (empty: the
//            store has no secret)
//   AUTH     value = HMAC-SHA256(secret, context || nonce); OK, or ERROR and
//            the connection is closed. A store with a secret answers every
//            other request before a good AUTH with ERROR and closes.
// A key list is u32 count, then per key u32 length + bytes.
// A parked GET/WAIT that expires on the server is answered NOT_FOUND, with the
// missing keys (comma-separated) in the value, so the connection stays in step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::store_protocol {

enum class Op : uint16_t {
  // requests
  set = 1,
  get = 2,
  try_get = 3,
  add = 4,
  wait = 5,
  check = 6,
  erase = 7,
  hello = 8,
  goodbye = 9,
  heartbeat = 10,
  auth_begin = 11,  // asks for this connection's challenge (a nonce)
  auth = 12,        // value = the proof (job_secret.h)
  // responses
  ok = 100,
  value = 101,
  not_found = 102,
  error = 103,
};

inline constexpr size_t kHeaderBytes = 16;
// An error reply whose text starts so: the connection's rank is recorded as
// failed and may not write (the client throws Excluded).
inline constexpr const char* kFencedPrefix = "fenced: ";

struct Header {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t opcode = 0;
  uint32_t key_bytes = 0;
  uint32_t value_bytes = 0;

  size_t frame_bytes() const { return kHeaderBytes + key_bytes + value_bytes; }
};

bool is_request(uint16_t opcode);
bool is_response(uint16_t opcode);
const char* op_name(uint16_t opcode);

// Appends one complete frame to `out`.
void append_frame(std::string& out, Op op, std::string_view key, std::string_view value);
std::string encode_frame(Op op, std::string_view key, std::string_view value);

// Reads a header from kHeaderBytes bytes (no validation).
Header decode_header(const void* bytes);
// Why the header is unacceptable, or nullopt if it is fine. `expect_request`
// selects which opcode family is legal in this direction.
std::optional<std::string> validate_header(const Header& h, bool expect_request);

// The first frame at the front of a receive buffer: a complete frame, a
// partial one (wait for more bytes), or a broken one (`error` says why). A bad
// header is reported as soon as its 16 bytes are there, before any body.
struct Scan {
  enum Kind { partial, complete, broken } kind = partial;
  Header header;                // valid when complete
  std::string error;            // set when broken
  std::string_view key, value;  // views into the buffer when complete
};
Scan scan_frame(std::string_view buffer, bool expect_request);

// "<rank>:<interval ms>" of a HEARTBEAT; nullopt unless 0 <= rank <= INT32_MAX
// and 0 < interval <= max_interval_ms.
struct HeartbeatValue {
  int rank;
  int64_t interval_ms;
};
std::optional<HeartbeatValue> parse_heartbeat(std::string_view value, int64_t max_interval_ms);

// u64 little-endian helpers for the wait field.
void append_u64(std::string& out, uint64_t v);
std::optional<uint64_t> read_u64(std::string_view bytes);

std::string encode_key_list(const std::vector<std::string>& keys);
// nullopt if malformed (truncated, trailing bytes, or a key over kMaxKeyBytes).
std::optional<std::vector<std::string>> decode_key_list(std::string_view bytes);

// Strict decimal int64 ("-12"; no spaces, no "+", no overflow).
std::optional<int64_t> parse_int64(std::string_view text);

}  // namespace tandem::store_protocol
