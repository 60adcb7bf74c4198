// The server side: one loop answering every worker's requests (terms in
// tandem/paramserver.h; messages in protocol.h).
//
// Per shard (the parts of one key this server owns, concatenated):
//  - value: what pulls read; applied: its step;
//  - accumulators: the sum of the pushes of a step not yet applied, one per
//    such step (a fast worker may push step t + 1 before step t is complete),
//    with the rows sparse pushes touched;
//  - pushed[w]: worker w's last pushed step.
// Step t is applied when every worker has pushed it and t - 1 is applied;
// pulls that may not read yet (step - staleness > applied) wait in a list
// and are answered right after the apply that allows them.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "protocol.h"
#include "tandem/errors.h"
#include "tandem/paramserver.h"
#include "tandem/reduce.h"

namespace tandem::ps {

using detail::Header;
using detail::Op;
using detail::tag;

namespace {

struct Accumulator {
  std::vector<std::byte> sum;   // shard-sized, zero where nothing was pushed
  std::vector<uint8_t> marked;  // per shard row: in `rows`
  std::vector<size_t> rows;     // shard rows sparse pushes touched
  bool dense = false;           // some push covered every row
  int pushes = 0;
};

struct Shard {
  const KeyLayout* key = nullptr;
  size_t rows = 0, row_bytes = 0;
  std::vector<std::byte> value;
  std::vector<float> momentum;  // sgd only
  uint64_t applied = 0;
  std::vector<uint64_t> pushed;  // per worker
  std::map<uint64_t, Accumulator> pending;
  std::vector<Accumulator> spare;
  // What the last applied step of a sum key wrote (to clear it before the next).
  bool last_dense = true;
  std::vector<size_t> last_rows;
  std::vector<size_t> part_index;  // parts of the key this server owns, in order
};

struct WaitingPull {
  int worker;
  Header h;
  std::vector<int64_t> ids;  // pull_rows only
};

class Server {
 public:
  Server(Channel& ch, const Options& o) : ch_(ch), options_(o), workers_(worker_count(ch.size(), o)) {
    me_ = ch.rank() - workers_;
  }

  uint64_t run() {
    std::vector<Header> headers(workers_);
    std::vector<Pending> posted(workers_);
    std::vector<bool> open(workers_, true);
    for (int w = 0; w < workers_; ++w) posted[w] = ch_.recv(w, tag(detail::kHeader, 0), &headers[w], sizeof(Header));
    int open_count = workers_;
    unsigned spins = 0;
    while (open_count > 0) {
      bool progressed = false;
      for (int w = 0; w < workers_; ++w) {
        if (!open[w] || !ch_.test(posted[w])) continue;
        progressed = true;
        const Header h = headers[w];
        if (h.op == Op::close) {
          open[w] = false;
          --open_count;
          continue;
        }
        posted[w] = ch_.recv(w, tag(detail::kHeader, 0), &headers[w], sizeof(Header));
        handle(w, h);
      }
      if (progressed) {
        spins = 0;
      } else {
        int peer = 0;
        while (peer < workers_ - 1 && !open[peer]) ++peer;
        ch_.idle(peer, ++spins);
      }
    }
    return steps_applied_;
  }

 private:
  void handle(int w, const Header& h) {
    if (h.op == Op::declare) return declare(w, h);
    if (shards_.empty() && layout_.empty())
      throw Error("parameter server: worker " + std::to_string(w) + " sent a request before declaring its keys");
    if (h.key >= layout_.size())
      throw Error("parameter server: worker " + std::to_string(w) + " named key " + std::to_string(h.key) +
                  ", beyond the declared " + std::to_string(layout_.size()));
    Shard& s = shards_[h.key];
    if (s.rows == 0)
      throw Error("parameter server: worker " + std::to_string(w) + " sent a request for key '" +
                  layout_[h.key].spec.name + "' to a server without a shard of it");
    switch (h.op) {
      case Op::push:
      case Op::push_rows: return push(w, h, s);
      case Op::set: return receive_dense(w, h, s, s.value.data());
      case Op::pull:
      case Op::pull_rows:
      case Op::pull_touched: {
        WaitingPull p{w, h, {}};
        if (h.op == Op::pull_rows && h.count > 0) {
          p.ids.resize(h.count);
          Pending in = ch_.recv(w, tag(detail::kIds, h.request), p.ids.data(), h.count * sizeof(int64_t));
          ch_.wait(in);
        }
        if (h.step <= s.applied + uint64_t(options_.staleness)) {
          answer(s, p);
        } else {
          waiting_.push_back(std::move(p));
        }
        return;
      }
      default:
        throw Error("parameter server: unknown request " + std::to_string(uint32_t(h.op)) + " from worker " +
                    std::to_string(w));
    }
  }

  // Every worker sends its declarations; all must match worker 0's.
  void declare(int w, const Header& h) {
    std::string table(h.count, '\0');
    Pending in = ch_.recv(w, tag(detail::kTable, 0), table.data(), table.size());
    ch_.wait(in);
    tables_.resize(workers_);
    tables_[w] = std::move(table);
    if (++declared_ < workers_) return;
    std::string verdict = "ok";
    const std::string mine = detail::declaration_text({}, options_, workers_);
    if (tables_[0].compare(0, mine.size(), mine) != 0) {
      verdict =
          "parameter server: server rank " + std::to_string(ch_.rank()) + " runs with " +
          mine.substr(0, mine.size() - 1) + ", but worker 0 declares " + tables_[0].substr(0, tables_[0].find('\n')) +
          "; give servers and workers the same options (TANDEM_SERVERS, TANDEM_PS_STALENESS, TANDEM_PS_PART_BYTES)";
    }
    for (int v = 1; v < workers_ && verdict == "ok"; ++v) {
      if (tables_[v] == tables_[0]) continue;
      verdict = "parameter server: workers declare different keys: " + first_difference(tables_[0], tables_[v], v) +
                "; every worker must declare the same keys (name, rows x cols, dtype, rule) in the same order";
    }
    if (verdict == "ok") {
      keys_ = detail::decode_table(tables_[0]);
      layout_ = plan(keys_, options_);
      build_shards();
    }
    std::vector<Pending> sent;
    const uint64_t len = verdict.size();
    for (int v = 0; v < workers_; ++v) {
      sent.push_back(ch_.send(v, tag(detail::kVerdict, 0), &len, sizeof len));
      sent.push_back(ch_.send(v, tag(detail::kVerdictText, 0), verdict.data(), verdict.size()));
    }
    ch_.wait_all(sent);
    if (verdict != "ok") throw InvalidArgument(verdict);
  }

  static std::string first_difference(const std::string& a, const std::string& b, int worker) {
    auto lines = [](const std::string& t) {
      std::vector<std::string> out;
      size_t at = 0;
      const size_t end = t.find('\0');
      while (at < end) {
        size_t nl = t.find('\n', at);
        if (nl == std::string::npos || nl > end) nl = end;
        out.push_back(t.substr(at, nl - at));
        at = nl + 1;
      }
      return out;
    };
    const auto la = lines(a), lb = lines(b);
    for (size_t i = 0; i < std::max(la.size(), lb.size()); ++i) {
      const std::string x = i < la.size() ? la[i] : "(nothing)", y = i < lb.size() ? lb[i] : "(nothing)";
      if (x != y) return "worker 0 has " + x + ", worker " + std::to_string(worker) + " has " + y;
    }
    return "worker 0 and worker " + std::to_string(worker) + " differ in a key's sgd parameters";
  }

  void build_shards() {
    shards_.resize(layout_.size());
    for (size_t k = 0; k < layout_.size(); ++k) {
      Shard& s = shards_[k];
      s.key = &layout_[k];
      s.rows = layout_[k].shard_rows[me_];
      if (s.rows == 0) continue;
      s.row_bytes = layout_[k].spec.cols * dtype_size(layout_[k].spec.dtype);
      s.value.assign(s.rows * s.row_bytes, std::byte{0});
      if (layout_[k].spec.rule == UpdateRule::sgd) s.momentum.assign(s.rows * layout_[k].spec.cols, 0.0f);
      s.pushed.assign(workers_, 0);
      for (size_t p = 0; p < layout_[k].parts.size(); ++p) {
        if (layout_[k].parts[p].server == me_) s.part_index.push_back(p);
      }
    }
  }

  Accumulator& accumulator(Shard& s, uint64_t step) {
    auto it = s.pending.find(step);
    if (it != s.pending.end()) return it->second;
    Accumulator a;
    if (!s.spare.empty()) {
      a = std::move(s.spare.back());
      s.spare.pop_back();
    } else {
      a.sum.assign(s.rows * s.row_bytes, std::byte{0});
      a.marked.assign(s.rows, 0);
    }
    return s.pending.emplace(step, std::move(a)).first->second;
  }

  // The dense parts of a push or set, received into `into` (shard layout).
  void receive_dense(int w, const Header& h, Shard& s, std::byte* into) {
    std::vector<Pending> in;
    for (size_t j = 0; j < s.part_index.size(); ++j) {
      const Part& p = s.key->parts[s.part_index[j]];
      in.push_back(
          ch_.recv(w, tag(detail::kPartData, h.request, j), into + p.shard_row * s.row_bytes, p.rows * s.row_bytes));
    }
    ch_.wait_all(in);
  }

  size_t shard_row(const Shard& s, int64_t id) const {
    const Part& p = s.key->parts[size_t(id) / s.key->rows_per_part];
    if (p.server != me_)
      throw Error("parameter server: row " + std::to_string(id) + " of '" + s.key->spec.name +
                  "' reached a server that does not own it");
    return p.shard_row + (size_t(id) - p.first_row);
  }

  void push(int w, const Header& h, Shard& s) {
    if (h.step != s.pushed[w] + 1) {
      throw Error("parameter server: worker " + std::to_string(w) + " pushed step " + std::to_string(h.step) + " of '" +
                  s.key->spec.name + "' after step " + std::to_string(s.pushed[w]));
    }
    s.pushed[w] = h.step;
    Accumulator& a = accumulator(s, h.step);
    const DataType dt = s.key->spec.dtype;
    if (h.op == Op::push) {
      if (a.pushes == 0 && a.rows.empty()) {
        receive_dense(w, h, s, a.sum.data());  // the first push of a step lands in place
      } else {
        scratch_.resize(s.rows * s.row_bytes);
        receive_dense(w, h, s, scratch_.data());
        reduce(dt, ReduceOp::sum, a.sum.data(), a.sum.data(), scratch_.data(), s.rows * s.key->spec.cols);
      }
      a.dense = true;
    } else if (h.count > 0) {
      ids_.resize(h.count);
      scratch_.resize(h.count * s.row_bytes);
      std::vector<Pending> in;
      in.push_back(ch_.recv(w, tag(detail::kIds, h.request), ids_.data(), h.count * sizeof(int64_t)));
      in.push_back(ch_.recv(w, tag(detail::kRows, h.request), scratch_.data(), scratch_.size()));
      ch_.wait_all(in);
      for (size_t i = 0; i < h.count; ++i) {
        const size_t r = shard_row(s, ids_[i]);
        std::byte* row = a.sum.data() + r * s.row_bytes;
        reduce(dt, ReduceOp::sum, row, row, scratch_.data() + i * s.row_bytes, s.key->spec.cols);
        if (!a.marked[r]) {
          a.marked[r] = 1;
          a.rows.push_back(r);
        }
      }
    }
    ++a.pushes;
    bool applied_any = false;
    for (auto it = s.pending.find(s.applied + 1); it != s.pending.end() && it->second.pushes == workers_;
         it = s.pending.find(s.applied + 1)) {
      apply(s, it->second);
      s.spare.push_back(std::move(it->second));
      s.pending.erase(it);
      ++s.applied;
      ++steps_applied_;
      applied_any = true;
    }
    if (applied_any) answer_waiting(s);
  }

  void apply(Shard& s, Accumulator& a) {
    const size_t cols = s.key->spec.cols;
    if (s.key->spec.rule == UpdateRule::sum) {
      if (a.dense) {
        std::swap(s.value, a.sum);
        std::memset(a.sum.data(), 0, a.sum.size());
      } else {
        if (s.last_dense) {
          std::memset(s.value.data(), 0, s.value.size());
        } else {
          for (size_t r : s.last_rows) std::memset(s.value.data() + r * s.row_bytes, 0, s.row_bytes);
        }
        for (size_t r : a.rows) {
          std::memcpy(s.value.data() + r * s.row_bytes, a.sum.data() + r * s.row_bytes, s.row_bytes);
          std::memset(a.sum.data() + r * s.row_bytes, 0, s.row_bytes);
        }
        s.last_rows = a.rows;
      }
      s.last_dense = a.dense;
    } else {
      const float lr = s.key->spec.lr, mu = s.key->spec.momentum, scale = 1.0f / float(workers_);
      auto* w = reinterpret_cast<float*>(s.value.data());
      auto* g = reinterpret_cast<float*>(a.sum.data());
      auto update = [&](size_t first, size_t n) {
        for (size_t i = first; i < first + n; ++i) {
          s.momentum[i] = mu * s.momentum[i] + g[i] * scale;
          w[i] -= lr * s.momentum[i];
          g[i] = 0.0f;
        }
      };
      if (a.dense) {
        update(0, s.rows * cols);
      } else {
        for (size_t r : a.rows) update(r * cols, cols);
      }
    }
    for (size_t r : a.rows) a.marked[r] = 0;
    a.rows.clear();
    a.dense = false;
    a.pushes = 0;
  }

  void answer_waiting(Shard& s) {
    const uint32_t key = uint32_t(&s - shards_.data());
    for (size_t i = 0; i < waiting_.size();) {
      WaitingPull& p = waiting_[i];
      if (p.h.key == key && p.h.step <= s.applied + uint64_t(options_.staleness)) {
        answer(s, p);
        waiting_.erase(waiting_.begin() + long(i));
      } else {
        ++i;
      }
    }
  }

  // Sends the applied step and the value (all owned parts, or the asked rows).
  void answer(Shard& s, const WaitingPull& p) {
    std::vector<Pending> sent;
    const uint64_t applied = s.applied;
    sent.push_back(ch_.send(p.worker, tag(detail::kStep, p.h.request), &applied, sizeof applied));
    if (p.h.op == Op::pull) {
      for (size_t j = 0; j < s.part_index.size(); ++j) {
        const Part& part = s.key->parts[s.part_index[j]];
        sent.push_back(ch_.send(p.worker, tag(detail::kReplyPart, p.h.request, j),
                                s.value.data() + part.shard_row * s.row_bytes, part.rows * s.row_bytes));
      }
    } else if (p.h.op == Op::pull_touched) {
      return answer_touched(s, p, sent);
    } else if (!p.ids.empty()) {
      reply_.resize(p.ids.size() * s.row_bytes);
      for (size_t i = 0; i < p.ids.size(); ++i) {
        std::memcpy(reply_.data() + i * s.row_bytes, s.value.data() + shard_row(s, p.ids[i]) * s.row_bytes,
                    s.row_bytes);
      }
      sent.push_back(ch_.send(p.worker, tag(detail::kReplyRows, p.h.request), reply_.data(), reply_.size()));
    }
    ch_.wait_all(sent);  // the value may change with the next request
  }

  // The rows the last applied step wrote: count, then ids and rows (sent after the applied step in `sent`).
  void answer_touched(Shard& s, const WaitingPull& p, std::vector<Pending>& sent) {
    touched_ids_.clear();
    if (s.last_dense) {
      for (size_t j : s.part_index) {
        const Part& part = s.key->parts[j];
        for (size_t r = 0; r < part.rows; ++r) touched_ids_.push_back(int64_t(part.first_row + r));
      }
    } else {
      for (size_t r : s.last_rows) {
        // The part holding shard row r: the last whose shard_row <= r.
        auto it = std::upper_bound(s.part_index.begin(), s.part_index.end(), r,
                                   [&](size_t row, size_t j) { return row < s.key->parts[j].shard_row; });
        const Part& part = s.key->parts[*(it - 1)];
        touched_ids_.push_back(int64_t(part.first_row + (r - part.shard_row)));
      }
    }
    const uint64_t count = s.applied == 0 ? 0 : touched_ids_.size();
    sent.push_back(ch_.send(p.worker, tag(detail::kCount, p.h.request), &count, sizeof count));
    if (count > 0) {
      reply_.resize(count * s.row_bytes);
      for (size_t i = 0; i < count; ++i) {
        std::memcpy(reply_.data() + i * s.row_bytes, s.value.data() + shard_row(s, touched_ids_[i]) * s.row_bytes,
                    s.row_bytes);
      }
      sent.push_back(
          ch_.send(p.worker, tag(detail::kReplyIds, p.h.request), touched_ids_.data(), count * sizeof(int64_t)));
      sent.push_back(ch_.send(p.worker, tag(detail::kReplyRows, p.h.request), reply_.data(), reply_.size()));
    }
    ch_.wait_all(sent);
  }

  Channel& ch_;
  Options options_;
  int workers_;
  int me_ = 0;
  int declared_ = 0;
  std::vector<std::string> tables_;
  std::vector<KeySpec> keys_;
  std::vector<KeyLayout> layout_;
  std::vector<Shard> shards_;
  std::vector<WaitingPull> waiting_;
  std::vector<std::byte> scratch_, reply_;
  std::vector<int64_t> ids_, touched_ids_;
  uint64_t steps_applied_ = 0;
};

}  // namespace

uint64_t serve(Communicator& comm, const Options& options) {
  if (options.servers < 1 || worker_count(comm.size(), options) < 1) {
    throw InvalidArgument("parameter server: " + std::to_string(comm.size()) + " ranks cannot hold " +
                          std::to_string(options.servers) + " server(s) and at least one worker");
  }
  if (!is_server(comm.rank(), comm.size(), options)) {
    throw InvalidArgument("parameter server: rank " + std::to_string(comm.rank()) +
                          " is a worker (servers are the last " + std::to_string(options.servers) +
                          " ranks); make a Client there, not serve()");
  }
  uint64_t applied = 0;
  CollectiveOptions o;
  o.timeout = options.serve_timeout;
  comm.exchange([&](Channel& ch) { applied = Server(ch, options).run(); }, o);
  return applied;
}

}  // namespace tandem::ps
