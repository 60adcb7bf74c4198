// What an all-to-all on one host can reach, with no protocol at all: N
// forked processes, pinned round-robin over the cores, each copies its block
// from every rank's input into its own output between two barriers (spin,
// then yield, as tandem's waits do when ranks outnumber cores). Three ways to
// reach a peer's input:
//   mapped-stream  inputs in one shared mapping, blocks by streaming stores
//   mapped-copy    the same by memcpy
//   cma            heap inputs, peers' blocks by process_vm_readv (the kernel's
//                  copy, as Open MPI's vader and tandem's direct path use), the
//                  own block by streaming stores
// Usage: tandem-alltoall-bound MODE RANKS BYTES_PER_RANK CALLS
// Prints: mode,ranks,bytes,mean_us,median_us,min_us (rank 0's per-call times).
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tandem/reduce.h"

namespace {

enum class Mode { mapped_stream, mapped_copy, cma };

// The shared page every rank publishes to: barrier counters on lines of their own, pids, input addresses.
struct Board {
  alignas(64) std::atomic<long> before{0};
  alignas(64) std::atomic<long> after{0};
  alignas(64) pid_t pid[64];
  void* input[64];
};

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "tandem-alltoall-bound: %s\n", why.c_str());
  std::_Exit(1);
}

// A rank that died or failed never arrives: the others give up after a minute.
void barrier(std::atomic<long>& count, long target) {
  constexpr auto kDeadline = std::chrono::seconds(60);
  const auto start = std::chrono::steady_clock::now();
  for (unsigned spins = 0; count.load(std::memory_order_acquire) < target; ++spins) {
    if (spins <= 16) continue;
    sched_yield();
    if (spins % 1024 == 0 && std::chrono::steady_clock::now() - start > kDeadline) {
      fail("a rank did not reach the barrier within 60 s (it failed or died)");
    }
  }
}

int usage(const char* why) {
  std::fprintf(stderr,
               "tandem-alltoall-bound: %s\nusage: tandem-alltoall-bound mapped-stream|mapped-copy|cma RANKS "
               "BYTES_PER_RANK CALLS (RANKS 2-64, bytes a multiple of 64 * RANKS)\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) return usage("four arguments expected");
  const std::string m = argv[1];
  const Mode mode = m == "mapped-stream" ? Mode::mapped_stream : m == "mapped-copy" ? Mode::mapped_copy : Mode::cma;
  if (m != "mapped-stream" && m != "mapped-copy" && m != "cma") return usage(("unknown mode " + m).c_str());
  const int n = std::atoi(argv[2]);
  const size_t bytes = std::strtoull(argv[3], nullptr, 10);
  const int calls = std::atoi(argv[4]);
  if (n < 2 || n > 64 || bytes == 0 || bytes % (64 * size_t(n)) != 0 || calls < 1) return usage("bad arguments");
  const size_t block = bytes / size_t(n);

  auto* board =
      static_cast<Board*>(mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* mapped = static_cast<std::byte*>(
      mmap(nullptr, bytes * size_t(n), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (board == MAP_FAILED || mapped == MAP_FAILED) return usage("mmap failed");
  new (board) Board;
  int r = 0;
  for (int k = 1; k < n; ++k) {
    if (fork() == 0) {
      r = k;
      break;
    }
  }
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(int(r % cores), &set);
  sched_setaffinity(0, sizeof set, &set);

  auto* in = mode == Mode::cma ? static_cast<std::byte*>(std::aligned_alloc(4096, bytes)) : mapped + size_t(r) * bytes;
  auto* out = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
  std::memset(in, r + 1, bytes);
  std::memset(out, 0, bytes);
  board->pid[r] = getpid();
  board->input[r] = in;

  std::vector<double> us;
  constexpr int kWarmCalls = 5;  // pages and caches: fewer left the first timed calls slower
  for (int call = -kWarmCalls; call < calls; ++call) {
    const long target = long(n) * (call + kWarmCalls + 1);
    board->before.fetch_add(1);
    barrier(board->before, target);
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < n; ++k) {
      const int p = (r + k) % n;
      std::byte* to = out + size_t(p) * block;
      const std::byte* from = static_cast<std::byte*>(board->input[p]) + size_t(r) * block;
      if (mode == Mode::cma && p != r) {
        iovec local{to, block}, remote{const_cast<std::byte*>(from), block};
        if (process_vm_readv(board->pid[p], &local, 1, &remote, 1, 0) != ssize_t(block)) {
          fail("process_vm_readv from rank " + std::to_string(p) + " failed: " + std::strerror(errno));
        }
      } else if (mode == Mode::mapped_copy) {
        std::memcpy(to, from, block);
      } else {
        tandem::copy_streaming(to, from, block);
      }
    }
    board->after.fetch_add(1);
    barrier(board->after, target);
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - t0;
    if (call >= 0) us.push_back(took.count());
  }
  if (r != 0) return 0;
  while (wait(nullptr) > 0) {
  }
  const double mean = std::accumulate(us.begin(), us.end(), 0.0) / double(us.size());
  std::sort(us.begin(), us.end());
  std::printf("%s,%d,%zu,%.2f,%.2f,%.2f\n", m.c_str(), n, bytes, mean, us[us.size() / 2], us.front());
  return 0;
}
