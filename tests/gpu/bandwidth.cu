// Bandwidth of the CUDA kernels against a device-to-device copy measured in
// the same run: bytes read plus bytes written per second, timed with CUDA
// events after a warm-up, the median of `samples` samples, each sample as many
// back-to-back calls as fill about 0.2 ms. Inputs are finite values in [-2, 2)
// (NaN codes would take the conversions' slow path, which real gradients do not).
#include <algorithm>
#include <functional>

#include "codec_cuda.h"
#include "gpu_test.h"
#include "reduce_cuda.h"

namespace tandem::gpu_test {
namespace {

using fn::bf16_t;
using fn::f16_t;

__device__ uint32_t mix(uint64_t x) {  // splitmix64's finaliser, top half
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((x ^ (x >> 31)) >> 32);
}

template <class T>
__global__ void fill_kernel(T* p, size_t n, uint64_t seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = mix(seed * 0x100000001B3ull + i);
    if constexpr (std::is_integral_v<T>) {
      p[i] = static_cast<T>(h);
    } else {
      const float v = static_cast<float>(h) * 0x1p-30f - 2.0f;  // [-2, 2)
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        p[i] = static_cast<T>(v);
      } else {
        p[i] = fn::Arith<T>::narrow(v);
      }
    }
  }
}

template <class T>
void fill(void* p, size_t n, uint64_t seed) {
  fill_kernel<<<1024, 256>>>(static_cast<T*>(p), n, seed);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

// One kernel to time: bytes moved per call at size `bytes`, what to fill first, the call itself.
struct Case {
  std::string kernel;
  bool target;
  std::function<double(size_t bytes)> moved;
  std::function<void(size_t bytes)> prepare;
  std::function<void(size_t bytes)> call;
};

class Timer {
 public:
  Timer() {
    TANDEM_CUDA_CHECK(cudaEventCreate(&start_));
    TANDEM_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // Seconds for `reps` back-to-back calls.
  double time(const std::function<void()>& call, int reps) {
    TANDEM_CUDA_CHECK(cudaEventRecord(start_));
    for (int r = 0; r < reps; ++r) call();
    TANDEM_CUDA_CHECK(cudaEventRecord(stop_));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

// Median seconds of one call.
double median_seconds(const std::function<void()>& call, int samples, Timer& timer) {
  timer.time(call, 3);  // warm-up
  const double one = std::max(timer.time(call, 1), 1e-7);
  const int reps = static_cast<int>(std::clamp(2e-4 / one, 1.0, 2000.0));
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) t.push_back(timer.time(call, reps) / reps);
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace

BandwidthReport run_bandwidth(const BandwidthOptions& options) {
  BandwidthReport report;
  for (size_t s = size_t{1} << 20; s <= (options.quick ? size_t{64} << 20 : size_t{1} << 30); s *= 4) {
    report.sizes.push_back(s);
  }
  const size_t largest = report.sizes.back();
  void *x = nullptr, *y = nullptr, *z = nullptr;
  unsigned* flag = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&flag, sizeof(unsigned)));
  TANDEM_CUDA_CHECK(cudaMalloc(&x, largest));
  TANDEM_CUDA_CHECK(cudaMalloc(&y, largest));
  TANDEM_CUDA_CHECK(cudaMalloc(&z, largest));

  std::vector<Case> cases;
  cases.push_back({"copy (cudaMemcpyAsync)", false, [](size_t b) { return 2.0 * b; },
                   [&](size_t b) { fill<float>(x, b / 4, 1); },
                   [&](size_t b) { TANDEM_CUDA_CHECK(cudaMemcpyAsync(y, x, b, cudaMemcpyDeviceToDevice)); }});
  auto reduce_case = [&](DataType dtype, ReduceOp op, bool target) {
    with_type(dtype, [&](auto t) {
      using T = decltype(t);
      cases.push_back({name_of(("reduce_cuda " + std::string(to_string(op))).c_str(), dtype), target,
                       [](size_t b) { return 3.0 * b; },
                       [&](size_t b) {
                         fill<T>(x, b / sizeof(T), 2);
                         fill<T>(y, b / sizeof(T), 3);
                       },
                       [&, dtype, op](size_t b) { detail::reduce_cuda(dtype, op, z, x, y, b / sizeof(T), nullptr); }});
    });
  };
  for (DataType dtype : kAllDataTypes) {
    const bool target = dtype == DataType::f32 || dtype == DataType::f16 || dtype == DataType::bf16;
    reduce_case(dtype, ReduceOp::sum, target);
  }
  for (ReduceOp op : {ReduceOp::min, ReduceOp::max, ReduceOp::prod}) reduce_case(DataType::f16, op, false);
  for (DataType dtype : {DataType::f32, DataType::f64, DataType::f16, DataType::bf16}) {
    with_type(dtype, [&](auto t) {
      using T = decltype(t);
      // Divisor 1: repeated calls leave the values where they were (no drift into subnormals).
      cases.push_back({name_of("scale_avg_cuda", dtype), false, [](size_t b) { return 2.0 * b; },
                       [&](size_t b) { fill<T>(x, b / sizeof(T), 4); },
                       [&, dtype](size_t b) { detail::scale_avg_cuda(dtype, x, b / sizeof(T), 1, nullptr); }});
    });
  }
  auto codec_cases = [&](codec::Format format, const char* name, auto code) {
    using T = decltype(code);
    const std::string suffix = std::string(" ") + name;
    auto* f = static_cast<float*>(x);
    auto* r = static_cast<float*>(y);
    auto* c = static_cast<uint16_t*>(z);
    cases.push_back({"encode_cuda" + suffix, true, [](size_t b) { return 1.5 * b; },
                     [&](size_t b) { fill<float>(x, b / 4, 5); },
                     [=](size_t b) { codec::encode_cuda(format, f, c, b / 4, 1.0f, nullptr); }});
    cases.push_back({"decode_cuda" + suffix, true, [](size_t b) { return 1.5 * b; },
                     [&](size_t b) { fill<T>(z, b / 4, 6); },
                     [=](size_t b) { codec::decode_cuda(format, c, f, b / 4, 1.0f, nullptr); }});
    cases.push_back({"encode_feedback_cuda" + suffix, true, [](size_t b) { return 4.5 * b; },
                     [&](size_t b) {
                       fill<float>(x, b / 4, 7);
                       fill<float>(y, b / 4, 8);
                     },
                     [=](size_t b) { codec::encode_feedback_cuda(format, f, r, c, b / 4, 1.0f, 1.0f, nullptr); }});
    cases.push_back({"nonfinite_cuda" + suffix, true, [](size_t b) { return 0.5 * b; },
                     [&](size_t b) { fill<T>(z, b / 4, 9); },
                     [=](size_t b) { codec::nonfinite_cuda(format, c, b / 4, flag, nullptr); }});
    // The blocking call around it: a launch and a synchronisation on top (not held to the target).
    cases.push_back({"all_finite_cuda" + suffix, false, [](size_t b) { return 0.5 * b; },
                     [&](size_t b) { fill<T>(z, b / 4, 9); },
                     [=](size_t b) { codec::all_finite_cuda(format, c, b / 4, nullptr); }});
  };
  codec_cases(codec::Format::f16, "fp16", f16_t{});
  codec_cases(codec::Format::bf16, "bf16", bf16_t{});

  Timer timer;
  std::vector<BandwidthRow> rows;
  for (const Case& c : cases) rows.push_back({c.kernel, c.target, std::vector<double>(report.sizes.size(), 0.0)});
  // Size by size, so every kernel at a size is timed beside the copy at that size.
  for (size_t k = 0; k < report.sizes.size(); ++k) {
    const size_t bytes = report.sizes[k];
    for (size_t i = 0; i < cases.size(); ++i) {
      cases[i].prepare(bytes);
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
      const double seconds = median_seconds([&] { cases[i].call(bytes); }, options.samples, timer);
      rows[i].gbps[k] = cases[i].moved(bytes) / seconds * 1e-9;
    }
  }
  cudaFree(flag);
  cudaFree(x);
  cudaFree(y);
  cudaFree(z);
  report.copy = rows.front();
  report.rows.assign(rows.begin() + 1, rows.end());
  return report;
}

}  // namespace tandem::gpu_test
