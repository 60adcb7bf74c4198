// The worker side: requests to the servers owning a key's shards (terms in
// tandem/paramserver.h; messages in protocol.h). Each request is one
// Communicator::exchange: it posts its receives first, then sends.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "protocol.h"
#include "tandem/errors.h"
#include "tandem/paramserver.h"

namespace tandem::ps {

using detail::Header;
using detail::Kind;
using detail::Op;
using detail::tag;

Client::Client(Communicator& comm, std::vector<KeySpec> keys, const Options& options)
    : comm_(comm), options_(options), workers_(worker_count(comm.size(), options)) {
  if (options.servers < 1 || workers_ < 1) {
    throw InvalidArgument("parameter server: " + std::to_string(comm.size()) + " ranks cannot hold " +
                          std::to_string(options.servers) +
                          " server(s) and at least one worker; start more ranks or "
                          "fewer servers (tandem launch -n W --servers S)");
  }
  if (is_server(comm.rank(), comm.size(), options)) {
    throw InvalidArgument("parameter server: rank " + std::to_string(comm.rank()) + " is a server (the last " +
                          std::to_string(options.servers) + " ranks are); run serve() there, not a Client");
  }
  layout_ = plan(keys, options);
  steps_.assign(layout_.size(), 0);
  const std::string table = detail::encode_table(keys, options, workers_);
  std::string verdict = "ok";
  comm_.exchange(
      [&](Channel& ch) {
        const Header h{Op::declare, 0, 0, table.size(), 0, 0};
        std::vector<Pending> sent;
        for (int s = 0; s < options_.servers; ++s) {
          sent.push_back(ch.send(workers_ + s, tag(detail::kHeader, 0), &h, sizeof h));
          sent.push_back(ch.send(workers_ + s, tag(detail::kTable, 0), table.data(), table.size()));
        }
        ch.wait_all(sent);
        for (int s = 0; s < options_.servers; ++s) {
          uint64_t len = 0;
          Pending p = ch.recv(workers_ + s, tag(detail::kVerdict, 0), &len, sizeof len);
          ch.wait(p);
          std::string text(len, '\0');
          Pending q = ch.recv(workers_ + s, tag(detail::kVerdictText, 0), text.data(), len);
          ch.wait(q);
          if (verdict == "ok") verdict = text;
        }
      },
      call_options());
  if (verdict != "ok") throw InvalidArgument(verdict);
}

Client::~Client() {
  try {
    close();
  } catch (const std::exception& e) {
    spdlog::warn("tandem rank {}: parameter server client close: {}", comm_.rank(), e.what());
  }
}

void Client::close() {
  if (closed_) return;
  closed_ = true;
  if (comm_.aborted()) return;
  comm_.exchange(
      [&](Channel& ch) {
        const Header h{Op::close, 0, 0, 0, 0, 0};
        std::vector<Pending> sent;
        for (int s = 0; s < options_.servers; ++s)
          sent.push_back(ch.send(workers_ + s, tag(detail::kHeader, 0), &h, sizeof h));
        ch.wait_all(sent);
      },
      call_options());
}

CollectiveOptions Client::call_options() const {
  CollectiveOptions o;
  o.timeout = options_.timeout;
  return o;
}

size_t Client::index(const std::string& key, const char* call) const {
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (layout_[i].spec.name == key) return i;
  }
  std::string known;
  for (const auto& l : layout_) known += (known.empty() ? "'" : ", '") + l.spec.name + "'";
  throw InvalidArgument(std::string(call) + ": key '" + key + "' was not declared (declared: " +
                        (known.empty() ? "none" : known) + "); declare every key when making the Client");
}

const KeyLayout& Client::find(const std::string& key, const char* call, size_t count, DataType dtype) const {
  const KeyLayout& l = layout_[index(key, call)];
  if (closed_) throw InvalidArgument(std::string(call) + ": the Client is closed");
  if (dtype != l.spec.dtype) {
    throw InvalidArgument(std::string(call) + " '" + key + "': dtype " + std::string(to_string(dtype)) +
                          " given, but the key was declared " + std::string(to_string(l.spec.dtype)));
  }
  if (count != std::numeric_limits<size_t>::max() && count != l.spec.elements()) {
    throw InvalidArgument(std::string(call) + " '" + key + "': " + std::to_string(count) +
                          " elements given, but the key was declared " + std::to_string(l.spec.rows) + " x " +
                          std::to_string(l.spec.cols) + " = " + std::to_string(l.spec.elements()) + " elements");
  }
  return l;
}

uint64_t Client::step(const std::string& key) const { return steps_[index(key, "step")]; }

namespace {

// Dense push or set: a header to every server holding a shard, then its parts
// straight from the caller's buffer.
void send_dense(Channel& ch, const KeyLayout& l, int workers, Header h, const void* data) {
  const size_t row_bytes = l.spec.cols * dtype_size(l.spec.dtype);
  const auto* bytes = static_cast<const std::byte*>(data);
  std::vector<Header> headers;
  headers.reserve(l.shard_rows.size());
  std::vector<Pending> sent;
  for (int s = 0; s < int(l.shard_rows.size()); ++s) {
    if (l.shard_rows[s] == 0) continue;
    headers.push_back(h);
    sent.push_back(ch.send(workers + s, tag(detail::kHeader, 0), &headers.back(), sizeof h));
    size_t j = 0;
    for (const auto& p : l.parts) {
      if (p.server != s) continue;
      sent.push_back(ch.send(workers + s, tag(detail::kPartData, h.request, j++), bytes + p.first_row * row_bytes,
                             p.rows * row_bytes));
    }
  }
  ch.wait_all(sent);
}

// Row ids grouped by the server owning them, with where each came from.
struct RowsByServer {
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<size_t>> from;
};

RowsByServer group_rows(const KeyLayout& l, const int64_t* ids, size_t n) {
  RowsByServer g;
  g.ids.resize(l.shard_rows.size());
  g.from.resize(l.shard_rows.size());
  for (size_t i = 0; i < n; ++i) {
    const int s = l.parts[size_t(ids[i]) / l.rows_per_part].server;
    g.ids[s].push_back(ids[i]);
    g.from[s].push_back(i);
  }
  return g;
}

void check_ids(const KeyLayout& l, const char* call, const int64_t* ids, size_t n) {
  if (n > 0 && !ids)
    throw InvalidArgument(std::string(call) + " '" + l.spec.name + "': null ids with n = " + std::to_string(n));
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || uint64_t(ids[i]) >= l.spec.rows) {
      throw InvalidArgument(std::string(call) + " '" + l.spec.name + "': row id " + std::to_string(ids[i]) +
                            " at position " + std::to_string(i) + " is outside the key's " +
                            std::to_string(l.spec.rows) + " rows");
    }
  }
}

}  // namespace

Request Client::push_async(const std::string& key, const void* data, size_t count, DataType dtype) {
  const KeyLayout& l = find(key, "push", count, dtype);
  const uint32_t k = uint32_t(&l - layout_.data());
  const Header h{Op::push, k, ++steps_[k], 0, next_request_++, 0};
  return comm_.exchange_async([&l, h, data, w = workers_](Channel& ch) { send_dense(ch, l, w, h, data); },
                              call_options());
}

void Client::push(const std::string& key, const void* data, size_t count, DataType dtype) {
  push_async(key, data, count, dtype).wait();
}

void Client::set(const std::string& key, const void* data, size_t count, DataType dtype) {
  const KeyLayout& l = find(key, "set", count, dtype);
  const Header h{Op::set, uint32_t(&l - layout_.data()), 0, 0, next_request_++, 0};
  comm_.exchange([&](Channel& ch) { send_dense(ch, l, workers_, h, data); }, call_options());
}

Request Client::push_rows_async(const std::string& key, const int64_t* ids, size_t n, const void* rows,
                                DataType dtype) {
  const KeyLayout& l = find(key, "push_rows", std::numeric_limits<size_t>::max(), dtype);
  check_ids(l, "push_rows", ids, n);
  const uint32_t k = uint32_t(&l - layout_.data());
  const Header h{Op::push_rows, k, ++steps_[k], 0, next_request_++, 0};
  return comm_.exchange_async(
      [&l, h, ids, n, rows, w = workers_](Channel& ch) {
        const size_t row_bytes = l.spec.cols * dtype_size(l.spec.dtype);
        RowsByServer g = group_rows(l, ids, n);
        std::vector<std::vector<std::byte>> gathered(g.ids.size());
        std::vector<Header> headers(g.ids.size(), h);
        std::vector<Pending> sent;
        for (int s = 0; s < int(g.ids.size()); ++s) {
          if (l.shard_rows[s] == 0) continue;
          headers[s].count = g.ids[s].size();
          sent.push_back(ch.send(w + s, tag(detail::kHeader, 0), &headers[s], sizeof h));
          if (g.ids[s].empty()) continue;
          gathered[s].resize(g.ids[s].size() * row_bytes);
          for (size_t i = 0; i < g.from[s].size(); ++i) {
            std::memcpy(gathered[s].data() + i * row_bytes,
                        static_cast<const std::byte*>(rows) + g.from[s][i] * row_bytes, row_bytes);
          }
          sent.push_back(
              ch.send(w + s, tag(detail::kIds, h.request), g.ids[s].data(), g.ids[s].size() * sizeof(int64_t)));
          sent.push_back(ch.send(w + s, tag(detail::kRows, h.request), gathered[s].data(), gathered[s].size()));
        }
        ch.wait_all(sent);
      },
      call_options());
}

void Client::push_rows(const std::string& key, const int64_t* ids, size_t n, const void* rows, DataType dtype) {
  push_rows_async(key, ids, n, rows, dtype).wait();
}

Request Client::pull_async(const std::string& key, void* out, size_t count, DataType dtype, uint64_t* step) {
  const KeyLayout& l = find(key, "pull", count, dtype);
  const uint32_t k = uint32_t(&l - layout_.data());
  const Header h{Op::pull, k, steps_[k], 0, next_request_++, 0};
  return comm_.exchange_async(
      [&l, h, out, step, w = workers_](Channel& ch) {
        const size_t row_bytes = l.spec.cols * dtype_size(l.spec.dtype);
        const size_t servers = l.shard_rows.size();
        std::vector<uint64_t> applied(servers, std::numeric_limits<uint64_t>::max());
        std::vector<Pending> posted;
        for (int s = 0; s < int(servers); ++s) {
          if (l.shard_rows[s] == 0) continue;
          posted.push_back(ch.recv(w + s, tag(detail::kStep, h.request), &applied[s], sizeof(uint64_t)));
          size_t j = 0;
          for (const auto& p : l.parts) {
            if (p.server != s) continue;
            posted.push_back(ch.recv(w + s, tag(detail::kReplyPart, h.request, j++),
                                     static_cast<std::byte*>(out) + p.first_row * row_bytes, p.rows * row_bytes));
          }
        }
        for (int s = 0; s < int(servers); ++s) {
          if (l.shard_rows[s] == 0) continue;
          posted.push_back(ch.send(w + s, tag(detail::kHeader, 0), &h, sizeof h));
        }
        ch.wait_all(posted);
        if (step) *step = *std::min_element(applied.begin(), applied.end());
      },
      call_options());
}

uint64_t Client::pull(const std::string& key, void* out, size_t count, DataType dtype) {
  uint64_t step = 0;
  pull_async(key, out, count, dtype, &step).wait();
  return step;
}

Request Client::pull_rows_async(const std::string& key, const int64_t* ids, size_t n, void* out, DataType dtype,
                                uint64_t* step) {
  const KeyLayout& l = find(key, "pull_rows", std::numeric_limits<size_t>::max(), dtype);
  check_ids(l, "pull_rows", ids, n);
  const uint32_t k = uint32_t(&l - layout_.data());
  const Header h{Op::pull_rows, k, steps_[k], 0, next_request_++, 0};
  return comm_.exchange_async(
      [&l, h, ids, n, out, step, w = workers_](Channel& ch) {
        const size_t row_bytes = l.spec.cols * dtype_size(l.spec.dtype);
        RowsByServer g = group_rows(l, ids, n);
        const size_t servers = g.ids.size();
        std::vector<uint64_t> applied(servers, std::numeric_limits<uint64_t>::max());
        std::vector<std::vector<std::byte>> gathered(servers);
        std::vector<Header> headers(servers, h);
        std::vector<Pending> posted;
        for (int s = 0; s < int(servers); ++s) {
          if (l.shard_rows[s] == 0) continue;
          posted.push_back(ch.recv(w + s, tag(detail::kStep, h.request), &applied[s], sizeof(uint64_t)));
          gathered[s].resize(g.ids[s].size() * row_bytes);
          if (!g.ids[s].empty()) {
            posted.push_back(
                ch.recv(w + s, tag(detail::kReplyRows, h.request), gathered[s].data(), gathered[s].size()));
          }
        }
        for (int s = 0; s < int(servers); ++s) {
          if (l.shard_rows[s] == 0) continue;
          headers[s].count = g.ids[s].size();
          posted.push_back(ch.send(w + s, tag(detail::kHeader, 0), &headers[s], sizeof h));
          if (!g.ids[s].empty()) {
            posted.push_back(
                ch.send(w + s, tag(detail::kIds, h.request), g.ids[s].data(), g.ids[s].size() * sizeof(int64_t)));
          }
        }
        ch.wait_all(posted);
        for (size_t s = 0; s < servers; ++s) {
          for (size_t i = 0; i < g.from[s].size(); ++i) {
            std::memcpy(static_cast<std::byte*>(out) + g.from[s][i] * row_bytes, gathered[s].data() + i * row_bytes,
                        row_bytes);
          }
        }
        if (step) *step = *std::min_element(applied.begin(), applied.end());
      },
      call_options());
}

uint64_t Client::pull_touched(const std::string& key, std::vector<int64_t>& ids, std::vector<std::byte>& rows) {
  const KeyLayout& l = layout_[index(key, "pull_touched")];
  if (closed_) throw InvalidArgument("pull_touched: the Client is closed");
  if (l.spec.rule != UpdateRule::sum) {
    throw InvalidArgument("pull_touched '" + key +
                          "': the key uses the sgd rule; pull_touched reads sum keys (use pull_rows)");
  }
  const uint32_t k = uint32_t(&l - layout_.data());
  const Header h{Op::pull_touched, k, steps_[k], 0, next_request_++, 0};
  uint64_t step = std::numeric_limits<uint64_t>::max();
  ids.clear();
  rows.clear();
  comm_.exchange(
      [&](Channel& ch) {
        const size_t row_bytes = l.spec.cols * dtype_size(l.spec.dtype);
        const size_t servers = l.shard_rows.size();
        std::vector<uint64_t> applied(servers, std::numeric_limits<uint64_t>::max()), count(servers, 0);
        std::vector<Pending> posted;
        for (int s = 0; s < int(servers); ++s) {
          if (l.shard_rows[s] == 0) continue;
          posted.push_back(ch.recv(workers_ + s, tag(detail::kStep, h.request), &applied[s], sizeof(uint64_t)));
          posted.push_back(ch.recv(workers_ + s, tag(detail::kCount, h.request), &count[s], sizeof(uint64_t)));
        }
        for (int s = 0; s < int(servers); ++s) {
          if (l.shard_rows[s] == 0) continue;
          posted.push_back(ch.send(workers_ + s, tag(detail::kHeader, 0), &h, sizeof h));
        }
        ch.wait_all(posted);
        posted.clear();
        size_t total = 0;
        for (uint64_t c : count) total += c;
        ids.resize(total);
        rows.resize(total * row_bytes);
        size_t at = 0;
        for (int s = 0; s < int(servers); ++s) {
          if (count[s] == 0) continue;
          posted.push_back(
              ch.recv(workers_ + s, tag(detail::kReplyIds, h.request), ids.data() + at, count[s] * sizeof(int64_t)));
          posted.push_back(ch.recv(workers_ + s, tag(detail::kReplyRows, h.request), rows.data() + at * row_bytes,
                                   count[s] * row_bytes));
          at += count[s];
        }
        ch.wait_all(posted);
        step = *std::min_element(applied.begin(), applied.end());
      },
      call_options());
  return step;
}

uint64_t Client::pull_rows(const std::string& key, const int64_t* ids, size_t n, void* out, DataType dtype) {
  uint64_t step = 0;
  pull_rows_async(key, ids, n, out, dtype, &step).wait();
  return step;
}

}  // namespace tandem::ps
