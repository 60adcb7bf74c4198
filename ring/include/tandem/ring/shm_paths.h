// The shared-memory path table: which way a call between ranks on one host
// goes, by collective, where its buffers lie and its size. The defaults with
// TANDEM_SHM_PATHS's rows over them; `tandem info` prints the table in effect
// (docs/algorithms.md, 'The path table').
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::ring {

// alltoall covers alltoallv.
enum class ShmCollective : uint8_t { allreduce, reduce, reduce_scatter, allgather, broadcast, alltoall };
constexpr size_t kShmCollectives = 6;
// heap: any memory; shared: Communicator::allocate_shared memory (every
// rank's; the broadcast: the root's).
enum class ShmBuffers : uint8_t { heap, shared };
constexpr size_t kShmBuffers = 2;
// staged: through the slots of the ranks' segments; mapped: shared buffers
// read and written in place; cma: heap buffers read by cross-memory attach;
// timed: staged or cma, whichever rank 0 timed faster for the size class.
enum class ShmPath : uint8_t { staged, mapped, cma, timed };

// Below this every call stages: a direct path's arrival round trip costs
// more than staging saves (docs/algorithms.md, 'shm: the direct floor').
// Not a row: every rank must agree on which calls arrive.
constexpr size_t kShmDirectMinBytes = 16 << 10;

const char* to_string(ShmCollective c);
const char* to_string(ShmBuffers b);
const char* to_string(ShmPath p);

// One row: calls of `collective` on `buffers` of `from` to `to` bytes (both
// included) take `path`.
struct ShmPathRow {
  ShmCollective collective{};
  ShmBuffers buffers{};
  size_t from = 0, to = SIZE_MAX;
  ShmPath path{};
};

// Copies share one immutable table.
class ShmPathTable {
 public:
  // The defaults.
  ShmPathTable();
  // The defaults with `overrides` over them: rows `collective:buffers:bytes=path`
  // separated by commas, later rows winning (docs/algorithms.md, 'The path
  // table'). Throws InvalidArgument naming the bad row, its bad part and the
  // choices.
  explicit ShmPathTable(const std::string& overrides);

  // The path of a call of `bytes` (as each collective counts them: the
  // buffer; reduce-scatter the input, allgather the output, all N blocks;
  // all-to-all what each rank sends).
  ShmPath path(ShmCollective c, ShmBuffers b, size_t bytes) const {
    const std::vector<Run>& r = runs(c, b);
    size_t i = r.size() - 1;
    while (r[i].from > bytes) --i;
    return r[i].path;
  }
  // The override rows as given ("" for the defaults).
  const std::string& overrides() const { return table_->overrides; }

  // A run of sizes taking one path: [from, the next run's from).
  struct Run {
    size_t from = 0;
    ShmPath path{};
    bool overridden = false;
  };
  // The runs of one collective on one kind of buffers, from 0 up.
  const std::vector<Run>& runs(ShmCollective c, ShmBuffers b) const {
    return table_->runs[size_t(c) * kShmBuffers + size_t(b)];
  }

  static const std::vector<ShmPathRow>& default_rows();

  struct Table {
    std::string overrides;
    std::array<std::vector<Run>, kShmCollectives * kShmBuffers> runs;
  };

 private:
  std::shared_ptr<const Table> table_;
};

// Whether `path` can carry `c` on `b`: staged always; mapped on shared
// buffers but for the reduce; cma on heap buffers; timed on heap buffers
// but for the broadcast.
bool shm_path_valid(ShmCollective c, ShmBuffers b, ShmPath path);

// The table as `tandem info` prints it, one line per collective and kind of
// buffers. `cma_unavailable`: why this host cannot use cross-memory attach
// ("" if it can); its cma and timed runs then print as staged.
std::string describe_shm_paths(const ShmPathTable& table, const std::string& cma_unavailable);

// Why this host's kernel settings keep ranks from cross-memory attach (Yama's
// ptrace_scope, a seccomp filter), or "" if nothing does. A prediction for
// `tandem info`: the communicator probes every peer at start-up.
std::string cross_memory_attach_limit();

}  // namespace tandem::ring
