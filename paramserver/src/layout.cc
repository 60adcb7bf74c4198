// Roles and the partition of keys into parts (terms in tandem/paramserver.h).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "tandem/errors.h"
#include "tandem/paramserver.h"

namespace tandem::ps {

Options options_from_env() {
  Options o;
  auto read = [](const char* name, long low, long fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end || x < low) {
      throw InvalidArgument(std::string(name) + "=" + v + ": expected an integer >= " + std::to_string(low));
    }
    return x;
  };
  o.servers = int(read("TANDEM_SERVERS", 0, 0));
  o.staleness = int(read("TANDEM_PS_STALENESS", 0, 0));
  o.part_bytes = size_t(read("TANDEM_PS_PART_BYTES", 1, long(o.part_bytes)));
  return o;
}

int worker_count(int size, const Options& options) { return size - options.servers; }

bool is_server(int rank, int size, const Options& options) { return rank >= worker_count(size, options); }

std::vector<KeyLayout> plan(const std::vector<KeySpec>& keys, const Options& options) {
  if (options.servers < 1) {
    throw InvalidArgument("parameter server: Options::servers is " + std::to_string(options.servers) +
                          "; start at least one (tandem launch --servers S, or TANDEM_SERVERS)");
  }
  if (options.staleness < 0) throw InvalidArgument("parameter server: Options::staleness must be >= 0");
  std::vector<KeyLayout> out;
  size_t next = 0;  // parts dealt so far, over all keys
  for (const auto& k : keys) {
    if (k.name.empty() || k.name.find_first_of("\n\t'") != std::string::npos) {
      throw InvalidArgument("parameter server: key name '" + k.name + "' must be non-empty, without quotes, tabs or newlines");
    }
    for (const auto& o : out) {
      if (o.spec.name == k.name) throw InvalidArgument("parameter server: key '" + k.name + "' is declared twice");
    }
    if (k.rows == 0 || k.cols == 0) {
      throw InvalidArgument("parameter server: key '" + k.name + "' has " + std::to_string(k.rows) + " x " +
                            std::to_string(k.cols) + " elements; declare rows and cols >= 1");
    }
    if (k.rule == UpdateRule::sgd && k.dtype != DataType::f32) {
      throw InvalidArgument("parameter server: key '" + k.name + "' uses the sgd rule with dtype " +
                            std::string(to_string(k.dtype)) + "; sgd runs on f32 keys only (use the sum rule)");
    }
    KeyLayout l;
    l.spec = k;
    const size_t row_bytes = k.cols * dtype_size(k.dtype);
    l.rows_per_part = std::max<size_t>(1, options.part_bytes / row_bytes);
    l.shard_rows.assign(options.servers, 0);
    for (size_t first = 0; first < k.rows; first += l.rows_per_part) {
      Part p;
      p.first_row = first;
      p.rows = std::min(l.rows_per_part, k.rows - first);
      p.server = int(next++ % size_t(options.servers));
      p.shard_row = l.shard_rows[p.server];
      l.shard_rows[p.server] += p.rows;
      l.parts.push_back(p);
    }
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace tandem::ps
