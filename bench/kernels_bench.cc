// Reduction-kernel microbenchmarks (Google Benchmark), one thread.
//
//   reduce/<isa>/<dtype>/<op>/<size>/<inplace|outofplace>   dst = a op b
//   memcpy/<size>                                            baseline
//   convert/<isa>/<f32_to_f16|...>/<size>
//   reduce_nt/avx512/f32/sum/<size>/outofplace               non-temporal-store experiment
//   fold/<isa>/f32/sum/<k>src/<size>/<chain|onepass>         dst = s0 op ... op s(k-1): k - 1
//                                                            reduce calls, or one reduce_many
//
// <size> is the size of ONE input array (64MiB: DRAM-bound, 1MiB: cache-resident).
// Reported numbers:
//   bytes_per_second  bytes of one input array per second (SetBytesProcessed),
//                     so reduce and memcpy of the same <size> are comparable;
//   traffic_GBps      bytes the loop must move per second: a op= b reads 2 and
//                     writes 1 array (3x), out-of-place the same 3x (plus the
//                     write-allocate read the CPU adds, not counted), memcpy 2x,
//                     conversions read + write their two widths;
//   isa               0 = scalar, 1 = avx2, 2 = avx512 (the label names it too).
// Compare in-place f32 sum against memcpy by traffic_GBps: the target is >= 80%.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tandem/reduce.h"
#include "tandem/reduce/kernels.h"  // per-ISA kernel tables
#include "tandem/types.h"

namespace {

using tandem::DataType;
using tandem::ReduceOp;
using tandem::detail::Isa;

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

// Page-aligned, pre-faulted buffers, kept for the whole run so each benchmark
// does not pay for page faults on 200 MB.
std::byte* buffer(int slot, size_t bytes) {
  static std::map<std::pair<int, size_t>, Buffer> buffers;
  auto& buf = buffers[{slot, bytes}];
  if (!buf) {
    buf.reset(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)));
    std::memset(buf.get(), 0, bytes);
  }
  return buf.get();
}

// Values that never turn into subnormals when combined over and over in
// place (sums grow, products stay at 1): subnormal arithmetic would measure
// the FPU's slow path, not the kernel.
void fill(DataType dtype, void* p, size_t count, bool second) {
  const float f = second ? 1.0f : 0.5f;
  switch (dtype) {
    case DataType::f32: std::fill_n(static_cast<float*>(p), count, f); break;
    case DataType::f64: std::fill_n(static_cast<double*>(p), count, double{f}); break;
    case DataType::f16: std::fill_n(static_cast<uint16_t*>(p), count, second ? 0x3C00 : 0x3800); break;
    case DataType::bf16: std::fill_n(static_cast<uint16_t*>(p), count, second ? 0x3F80 : 0x3F00); break;
    case DataType::i32: std::fill_n(static_cast<int32_t*>(p), count, second ? 1 : 3); break;
    case DataType::i64: std::fill_n(static_cast<int64_t*>(p), count, second ? 1 : 3); break;
    case DataType::u8: std::fill_n(static_cast<uint8_t*>(p), count, second ? 1 : 3); break;
  }
}

void set_counters(benchmark::State& state, size_t bytes, double traffic_factor, Isa isa) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["traffic_GBps"] = benchmark::Counter(traffic_factor * static_cast<double>(bytes) / 1e9,
                                                      benchmark::Counter::kIsIterationInvariantRate);
  state.counters["isa"] = static_cast<double>(isa);
  state.SetLabel(std::string(tandem::detail::to_string(isa)));
}

void bm_reduce(benchmark::State& state, Isa isa, DataType dtype, ReduceOp op, size_t bytes, bool inplace) {
  const auto& kernels = tandem::detail::kernel_table(isa);
  const size_t count = bytes / tandem::dtype_size(dtype);
  void* a = buffer(0, bytes);
  void* b = buffer(1, bytes);
  void* dst = inplace ? a : buffer(2, bytes);
  fill(dtype, a, count, false);
  fill(dtype, b, count, true);
  for (auto _ : state) {
    kernels.reduce(dtype, op, dst, a, b, count);
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes, 3.0, isa);
}

void bm_memcpy(benchmark::State& state, size_t bytes) {
  std::byte* src = buffer(1, bytes);
  std::byte* dst = buffer(0, bytes);
  std::memset(src, 1, bytes);
  for (auto _ : state) {
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes, 2.0, Isa::scalar);
  state.SetLabel("libc");
}

enum class Conv { f32_to_f16, f16_to_f32, f32_to_bf16, bf16_to_f32 };

void bm_convert(benchmark::State& state, Isa isa, Conv conv, size_t f32_bytes) {
  const auto& k = tandem::detail::kernel_table(isa);
  const size_t count = f32_bytes / 4;
  auto* wide = reinterpret_cast<float*>(buffer(0, f32_bytes));
  auto* narrow = reinterpret_cast<uint16_t*>(buffer(1, f32_bytes));  // uses the first half
  std::fill_n(wide, count, 1.25f);
  std::fill_n(narrow, count, uint16_t{0x3C00});
  for (auto _ : state) {
    switch (conv) {
      case Conv::f32_to_f16: k.f32_to_f16(wide, narrow, count); break;
      case Conv::f16_to_f32: k.f16_to_f32(narrow, wide, count); break;
      case Conv::f32_to_bf16: k.f32_to_bf16(wide, narrow, count); break;
      case Conv::bf16_to_f32: k.bf16_to_f32(narrow, wide, count); break;
    }
    benchmark::ClobberMemory();
  }
  // Bytes processed = the f32 side; traffic = 4 + 2 bytes per element.
  set_counters(state, f32_bytes, 1.5, isa);
}

// Experiment: out-of-place f32 sum with streaming (non-temporal) stores, which
// skip the write-allocate read of dst. Not in the library: see the report in
// the function-level comment of register_all().
__attribute__((target("avx512f"))) void sum_f32_stream(float* dst, const float* a, const float* b, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  for (; i < n; ++i) dst[i] = a[i] + b[i];
  _mm_sfence();
}

void bm_reduce_nt(benchmark::State& state, size_t bytes) {
  const size_t count = bytes / 4;
  auto* a = reinterpret_cast<float*>(buffer(0, bytes));
  auto* b = reinterpret_cast<float*>(buffer(1, bytes));
  auto* dst = reinterpret_cast<float*>(buffer(2, bytes));  // page-aligned, as streaming stores need
  fill(DataType::f32, a, count, false);
  fill(DataType::f32, b, count, true);
  for (auto _ : state) {
    sum_f32_stream(dst, a, b, count);
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes, 3.0, Isa::avx512);
}

// A staged fold of k ranks' slots: the chain of reduce calls the shared-memory
// paths made before reduce_many, against its one pass. Traffic: k sources read
// and dst written once (the chain moves more; its figure is then the same
// work's rate).
void bm_fold(benchmark::State& state, Isa isa, size_t k, size_t bytes, bool one_pass) {
  const auto& kernels = tandem::detail::kernel_table(isa);
  const size_t count = bytes / 4;
  std::vector<const void*> sources;
  for (size_t j = 0; j < k; ++j) {
    void* p = buffer(int(10 + j), bytes);
    fill(DataType::f32, p, count, j % 2 == 1);
    sources.push_back(p);
  }
  void* dst = buffer(2, bytes);
  for (auto _ : state) {
    if (one_pass) {
      kernels.reduce_many(DataType::f32, ReduceOp::sum, dst, sources.data(), k, count);
    } else {
      kernels.reduce(DataType::f32, ReduceOp::sum, dst, sources[0], sources[1], count);
      for (size_t j = 2; j < k; ++j) kernels.reduce(DataType::f32, ReduceOp::sum, dst, dst, sources[j], count);
    }
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes, double(k + 1), isa);
}

std::string size_name(size_t bytes) {
  return bytes >= kMiB ? std::to_string(bytes / kMiB) + "MiB" : std::to_string(bytes / kKiB) + "KiB";
}

void register_all() {
  const size_t sizes[] = {64 * kMiB, 1 * kMiB};
  for (size_t bytes : sizes) {
    benchmark::RegisterBenchmark(("memcpy/" + size_name(bytes)).c_str(), bm_memcpy, bytes)
        ->Unit(benchmark::kMicrosecond);
  }
  for (Isa isa : tandem::detail::kAllIsas) {
    if (!tandem::detail::cpu_supports(isa)) continue;
    const std::string isa_name(tandem::detail::to_string(isa));
    for (DataType dtype : tandem::kAllDataTypes) {
      for (ReduceOp op : tandem::kAllReduceOps) {
        for (size_t bytes : sizes) {
          for (bool inplace : {true, false}) {
            // Out-of-place only for f32 sum: it exists to show the write-allocate cost.
            if (!inplace && !(dtype == DataType::f32 && op == ReduceOp::sum)) continue;
            const std::string name = "reduce/" + isa_name + "/" + std::string(tandem::to_string(dtype)) + "/" +
                                     std::string(tandem::to_string(op)) + "/" + size_name(bytes) + "/" +
                                     (inplace ? "inplace" : "outofplace");
            benchmark::RegisterBenchmark(name.c_str(), bm_reduce, isa, dtype, op, bytes, inplace)
                ->Unit(benchmark::kMicrosecond);
          }
        }
      }
    }
    for (size_t k : {4, 8}) {
      for (size_t bytes : {64 * kKiB, 1 * kMiB}) {
        for (bool one_pass : {false, true}) {
          const std::string name = "fold/" + isa_name + "/f32/sum/" + std::to_string(k) + "src/" + size_name(bytes) +
                                   "/" + (one_pass ? "onepass" : "chain");
          benchmark::RegisterBenchmark(name.c_str(), bm_fold, isa, k, bytes, one_pass)->Unit(benchmark::kMicrosecond);
        }
      }
    }
    const std::pair<Conv, const char*> convs[] = {{Conv::f32_to_f16, "f32_to_f16"},
                                                  {Conv::f16_to_f32, "f16_to_f32"},
                                                  {Conv::f32_to_bf16, "f32_to_bf16"},
                                                  {Conv::bf16_to_f32, "bf16_to_f32"}};
    for (const auto& [conv, conv_name] : convs) {
      for (size_t bytes : sizes) {
        benchmark::RegisterBenchmark(("convert/" + isa_name + "/" + conv_name + "/" + size_name(bytes)).c_str(),
                                     bm_convert, isa, conv, bytes)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  if (tandem::detail::cpu_supports(Isa::avx512)) {
    for (size_t bytes : sizes) {
      benchmark::RegisterBenchmark(("reduce_nt/avx512/f32/sum/" + size_name(bytes) + "/outofplace").c_str(),
                                   bm_reduce_nt, bytes)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("dispatch_isa", std::string(tandem::reduce_isa()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
