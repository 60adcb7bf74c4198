// Roles and the partition of keys into parts (terms in tandem/paramserver.h).
#include <algorithm>
#include <string>

#include "tandem/errors.h"
#include "tandem/paramserver.h"

namespace tandem::ps {

namespace {

Setting row(const char* variable, const char* name, SettingKind kind, const char* default_value, const char* doc,
            long long min) {
  Setting s = setting_row("paramserver", variable, name, kind, default_value, doc);
  s.min = min;
  return s;
}

SettingTable<Options> make_table() {
  using K = SettingKind;
  return {
      number_field(row("TANDEM_SERVERS", "servers", K::count, "0",
                       "Parameter-server ranks: the last this many ranks serve (tandem launch --servers sets it).", 0),
                   &Options::servers),
      number_field(row("TANDEM_PS_STALENESS", "staleness", K::count, "0",
                       "Steps a worker may run ahead of the slowest (0: synchronous).", 0),
                   &Options::staleness),
      number_field(row("TANDEM_PS_PART_BYTES", "part_bytes", K::bytes, "4194304",
                       "Bytes of a key's part, the unit spread over the servers (at least one row).", 1),
                   &Options::part_bytes)};
}

}  // namespace

const SettingTable<Options>& settings() {
  static const SettingTable<Options> table = make_table();
  return table;
}

Options ps_options_from_env(const EnvLookup& env) {
  Options o;
  o.servers = 0;  // no TANDEM_SERVERS: no servers
  read_settings(settings(), env, o);
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
      throw InvalidArgument("parameter server: key name '" + k.name +
                            "' must be non-empty, without quotes, tabs or newlines");
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
