// The parameter server's messages. A request is a Header on kHeader from a
// worker to a server, followed by its payload messages; replies carry the
// request's number. Local tags (32 bits): kind in bits 0-3, request number in
// bits 4-19, part index within the shard in bits 20-31.
#pragma once

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/errors.h"
#include "tandem/paramserver.h"
#include "tandem/transport.h"

namespace tandem::ps::detail {

enum class Op : uint32_t {
  declare = 1,
  push = 2,
  push_rows = 3,
  pull = 4,
  pull_rows = 5,
  set = 6,
  close = 7,
  pull_touched = 8
};

enum Kind : uint32_t {
  kHeader = 1,
  kPartData = 2,   // worker -> server: one part of a dense push or set
  kIds = 3,        // worker -> server: row ids (int64)
  kRows = 4,       // worker -> server: rows of a sparse push
  kStep = 5,       // server -> worker: the applied step a pull read (uint64)
  kReplyPart = 6,  // server -> worker: one part of a dense pull
  kReplyRows = 7,  // server -> worker: rows of a sparse pull
  kTable = 8,      // worker -> server: the key declarations (text)
  kVerdict = 9,    // server -> worker: verdict length (uint64), then kVerdictText
  kVerdictText = 10,
  kCount = 11,     // server -> worker: how many rows follow (pull_touched)
  kReplyIds = 12,  // server -> worker: their ids
};

struct Header {
  Op op = Op::close;
  uint32_t key = 0;
  uint64_t step = 0;   // push: this push's step; pull: the worker's step when it pulled
  uint64_t count = 0;  // rows (sparse), bytes (declare)
  uint32_t request = 0;
  uint32_t unused = 0;
};
static_assert(sizeof(Header) == 32);

inline Tag tag(Kind kind, uint32_t request, size_t part = 0) {
  return Tag(kind) | (Tag(request & 0xffff) << 4) | (Tag(part & 0xfff) << 20);
}

// One line per key plus a first line of options: what every worker must agree on.
inline std::string declaration_text(const std::vector<KeySpec>& keys, const Options& o, int workers) {
  std::ostringstream s;
  s << "workers " << workers << ", servers " << o.servers << ", part_bytes " << o.part_bytes << ", staleness "
    << o.staleness << "\n";
  for (const auto& k : keys) {
    s << "key '" << k.name << "': " << k.rows << " x " << k.cols << " " << to_string(k.dtype) << ", "
      << (k.rule == UpdateRule::sum ? "sum" : "sgd");
    if (k.rule == UpdateRule::sgd) s << " lr " << k.lr << " momentum " << k.momentum;
    s << "\n";
  }
  return s.str();
}

// The declarations as the server reads them: the text above, a NUL, then per
// key its fields in binary (both ends are the same build).
inline std::string encode_table(const std::vector<KeySpec>& keys, const Options& o, int workers) {
  std::string out = declaration_text(keys, o, workers);
  out.push_back('\0');
  auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const uint64_t n = keys.size();
  put(&n, sizeof n);
  for (const auto& k : keys) {
    const uint64_t len = k.name.size(), rows = k.rows, cols = k.cols;
    const uint8_t dtype = uint8_t(k.dtype), rule = uint8_t(k.rule);
    put(&len, sizeof len);
    put(k.name.data(), len);
    put(&rows, sizeof rows);
    put(&cols, sizeof cols);
    put(&dtype, 1);
    put(&rule, 1);
    put(&k.lr, sizeof k.lr);
    put(&k.momentum, sizeof k.momentum);
  }
  return out;
}

inline std::vector<KeySpec> decode_table(const std::string& table) {
  size_t at = table.find('\0');
  if (at == std::string::npos) throw Error("parameter server: malformed key table");
  ++at;
  auto get = [&](void* p, size_t n) {
    if (at + n > table.size()) throw Error("parameter server: truncated key table");
    std::memcpy(p, table.data() + at, n);
    at += n;
  };
  uint64_t n = 0;
  get(&n, sizeof n);
  std::vector<KeySpec> keys(n);
  for (auto& k : keys) {
    uint64_t len = 0, rows = 0, cols = 0;
    uint8_t dtype = 0, rule = 0;
    get(&len, sizeof len);
    if (len > table.size()) throw Error("parameter server: malformed key table");
    k.name.resize(len);
    get(k.name.data(), len);
    get(&rows, sizeof rows);
    get(&cols, sizeof cols);
    get(&dtype, 1);
    get(&rule, 1);
    get(&k.lr, sizeof k.lr);
    get(&k.momentum, sizeof k.momentum);
    k.rows = rows;
    k.cols = cols;
    k.dtype = DataType(dtype);
    k.rule = UpdateRule(rule);
  }
  return keys;
}

}  // namespace tandem::ps::detail
