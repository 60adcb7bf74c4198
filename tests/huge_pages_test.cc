// Huge pages for heap buffers (comm/transport/huge_pages.h): which ranges are
// collapsed and when, that a collapse keeps every byte, and 2 real ranks
// whose all-to-all, send/recv and all-reduce of 8 MiB heap buffers give
// exact values and leave the buffers on huge pages (or, with
// huge_pages off, on the pages they came with).
#include "transport/huge_pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "multiprocess.h"
#include "tandem/tandem.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
constexpr size_t kHuge = HugePages::kHugePage;

// Anonymous private memory, as malloc gives for large buffers; unmapped at the end.
struct Mapping {
  explicit Mapping(size_t bytes, int prot = PROT_READ | PROT_WRITE) : bytes(bytes) {
    void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Mapping() {
    if (base) ::munmap(base, bytes);
  }
  // The first huge-page boundary inside, plus `offset`.
  std::byte* aligned(size_t offset = 0) const {
    return reinterpret_cast<std::byte*>((uintptr_t(base) + kHuge - 1) & ~(kHuge - 1)) + offset;
  }
  std::byte* base;
  size_t bytes;
};

// kB of `field` ("AnonHugePages", ...) in the mapping that holds p (/proc/self/smaps).
long smaps_kb(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      inside = uintptr_t(p) >= begin && uintptr_t(p) < end;
    } else if (inside && line.rfind(field + ":", 0) == 0) {
      return std::stol(line.substr(field.size() + 1));
    }
  }
  return -1;
}
long anon_huge_kb(const void* p) { return smaps_kb(p, "AnonHugePages"); }

// Whether this kernel collapses memory into huge pages for this process.
bool kernel_collapses() {
  Mapping m(3 * kHuge);
  std::memset(m.aligned(), 1, kHuge);
  HugePages pages;
  pages.note(m.aligned(), kHuge);
  return pages.counts().collapsed == 1;
}

uint8_t byte_at(int rank, size_t i) { return uint8_t((uint64_t(rank) * 131 + i * 2654435761u) >> 7); }

// The first of got[0, n) that differs from want(i), or n.
template <class T, class Want>
size_t first_wrong(const T* got, size_t n, Want want) {
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want(i)) return i;
  }
  return n;
}

TEST(HugePages, ABufferIsCollapsedAtItsFirstCallKeepingEveryByteAndNotAgain) {
  Mapping m(8 * kHuge);
  ASSERT_NE(m.base, nullptr);
  // A buffer from the middle of a page to past three huge-page boundaries.
  std::byte* p = m.base + 100;
  const size_t bytes = 5 * kHuge;
  for (size_t i = 0; i < bytes; ++i) p[i] = std::byte(byte_at(0, i));
  HugePages pages;
  pages.note(p, bytes);
  EXPECT_EQ(pages.counts().asked, 1u);
  for (int k = 0; k < 5; ++k) pages.note(p, bytes);
  EXPECT_EQ(pages.counts().asked, 1u) << "a buffer seen lately is not collapsed again";
  EXPECT_EQ(first_wrong(p, bytes, [](size_t i) { return std::byte(byte_at(0, i)); }), bytes);
  if (pages.counts().collapsed == 0) GTEST_SKIP() << "this kernel does not collapse (MADV_COLLAPSE needs Linux 6.1)";
  // Every whole huge page inside the buffer: 4 of them, whichever way the mapping fell.
  EXPECT_GE(anon_huge_kb(p), long(4 * kHuge / 1024));
}

TEST(HugePages, BuffersSpanningNoWholeHugePageAreLeftAlone) {
  Mapping m(4 * kHuge);
  ASSERT_NE(m.base, nullptr);
  HugePages pages;
  pages.note(m.aligned(), kHuge - 1);       // short of the boundary
  pages.note(m.aligned(1), kHuge);          // starts past it
  pages.note(m.aligned(kHuge / 2), kHuge);  // straddles one
  pages.note(nullptr, 4 * kHuge);
  EXPECT_FALSE(HugePages::holds_one(m.aligned(1), kHuge));
  EXPECT_TRUE(HugePages::holds_one(m.aligned(), kHuge));
  EXPECT_EQ(pages.counts().asked, 0u);
  EXPECT_EQ(anon_huge_kb(m.aligned()), 0);
}

TEST(HugePages, TheLeastRecentlySeenRangeMakesRoomAndIsCollapsedAgainWhenItReturns) {
  // Inaccessible memory: the kernel refuses every collapse, which counts as asked all the same.
  Mapping m((HugePages::kRanges + 2) * kHuge, PROT_NONE);
  ASSERT_NE(m.base, nullptr);
  HugePages pages;
  for (size_t k = 0; k < HugePages::kRanges; ++k) pages.note(m.aligned(k * kHuge), kHuge);
  EXPECT_EQ(pages.counts().asked, HugePages::kRanges);
  EXPECT_EQ(pages.counts().collapsed, 0u);
  pages.note(m.aligned(0), kHuge);  // seen again: now the most recent
  EXPECT_EQ(pages.counts().asked, HugePages::kRanges);
  pages.note(m.aligned(HugePages::kRanges * kHuge), kHuge);  // one more: range 1 makes room
  pages.note(m.aligned(0), kHuge);
  EXPECT_EQ(pages.counts().asked, HugePages::kRanges + 1);
  pages.note(m.aligned(1 * kHuge), kHuge);
  EXPECT_EQ(pages.counts().asked, HugePages::kRanges + 2);
}

TEST(HugePages, CollapsesStopOnceTheyHaveTakenTheBudget) {
  // Refused collapses (inaccessible memory) take time all the same.
  Mapping m(6 * kHuge, PROT_NONE);
  ASSERT_NE(m.base, nullptr);
  HugePages spent(1);  // 1 ns: the first collapse takes it
  spent.note(m.aligned(0), kHuge);
  spent.note(m.aligned(kHuge), kHuge);
  spent.note(m.aligned(2 * kHuge), kHuge);
  EXPECT_EQ(spent.counts().asked, 1u);
  EXPECT_EQ(spent.counts().over_budget, 2u);
  spent.note(m.aligned(kHuge), kHuge);  // remembered: neither asked nor counted again
  EXPECT_EQ(spent.counts().over_budget, 2u);
  HugePages ample;  // the default budget: a few refused collapses take none of it
  for (size_t k = 0; k < 4; ++k) ample.note(m.aligned(k * kHuge), kHuge);
  EXPECT_EQ(ample.counts().asked, 4u);
  EXPECT_EQ(ample.counts().over_budget, 0u);
}

// 2 ranks: all-to-all, a send/recv exchange and an all-reduce of 8 MiB heap
// buffers, each twice, checked exactly; then whether the buffers are on huge pages.
int large_calls(CommOptions o, bool huge_pages, bool collapses) {
  o.huge_pages = huge_pages;
  auto comm = ring::connect(o, {});
  const int n = comm->size(), r = comm->rank(), peer = 1 - r;
  const size_t bytes = 8 << 20;
  Mapping in_map(bytes + kHuge), out_map(bytes + kHuge);
  auto* in = reinterpret_cast<uint8_t*>(in_map.base + 4096);
  auto* out = reinterpret_cast<uint8_t*>(out_map.base + 4096);
  for (size_t i = 0; i < bytes; ++i) in[i] = byte_at(r, i);
  for (int round = 0; round < 2; ++round) {
    std::memset(out, 0, bytes);
    comm->alltoall(in, out, bytes / size_t(n), DataType::u8);
    const size_t block = bytes / size_t(n);
    EXPECT_EQ(first_wrong(out, bytes, [&](size_t i) { return byte_at(int(i / block), size_t(r) * block + i % block); }),
              bytes)
        << "all-to-all, round " << round;
    std::memset(out, 0, bytes);
    comm->group({{P2POp::send, in, bytes, DataType::u8, peer, 1}, {P2POp::recv, out, bytes, DataType::u8, peer, 1}});
    EXPECT_EQ(first_wrong(out, bytes, [&](size_t i) { return byte_at(peer, i); }), bytes)
        << "send/recv, round " << round;
  }
  auto* ints = reinterpret_cast<int32_t*>(in);
  auto* sums = reinterpret_cast<int32_t*>(out);
  const size_t count = bytes / 4;
  for (size_t i = 0; i < count; ++i) ints[i] = int32_t(i % 1000) * (r + 1);
  for (int round = 0; round < 2; ++round) {
    comm->allreduce(ints, sums, count, DataType::i32, ReduceOp::sum);
    EXPECT_EQ(first_wrong(sums, count, [](size_t i) { return int32_t(i % 1000) * 3; }), count) << "all-reduce";
  }
  // allocate_shared memory keeps its pages, in a group's messages as in a collective.
  auto* shared_in = static_cast<uint8_t*>(comm->allocate_shared(bytes));
  auto* shared_out = static_cast<uint8_t*>(comm->allocate_shared(bytes));
  for (size_t i = 0; i < bytes; ++i) shared_in[i] = byte_at(r, i);
  comm->group({{P2POp::send, shared_in, bytes, DataType::u8, peer, 2},
               {P2POp::recv, shared_out, bytes, DataType::u8, peer, 2}});
  EXPECT_EQ(first_wrong(shared_out, bytes, [&](size_t i) { return byte_at(peer, i); }), bytes)
      << "send/recv of allocate_shared buffers";
  for (const uint8_t* p : {shared_in, shared_out}) {
    EXPECT_EQ(smaps_kb(p, "ShmemPmdMapped") + smaps_kb(p, "FilePmdMapped"), 0) << "allocate_shared memory collapsed";
  }
  comm->free_shared(shared_in);
  comm->free_shared(shared_out);
  if (collapses) {
    const long want = huge_pages ? long(3 * kHuge / 1024) : 0;  // 3 of the 4 huge pages the buffer touches
    EXPECT_GE(anon_huge_kb(in), want) << "input";
    EXPECT_GE(anon_huge_kb(out), want) << "output";
    if (!huge_pages) {
      EXPECT_EQ(anon_huge_kb(in) + anon_huge_kb(out), 0);
    }
  }
  comm->barrier();
  return 0;
}

TEST(HugePages, TwoRanksLargeCallsGiveExactValuesOnHugePagesAndWithout) {
  const bool collapses = kernel_collapses();
  for (bool on : {true, false}) {
    RankGroup group(2, [on, collapses](const CommOptions& o) { return large_calls(o, on, collapses); });
    group.expect_success(120s);
  }
  if (!collapses) GTEST_SKIP() << "values checked; this kernel does not collapse, so the pages were not";
}

}  // namespace
}  // namespace tandem::testing
