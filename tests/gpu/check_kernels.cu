// Correctness of the CUDA kernels on device buffers against the CPU functors
// (functors.h, codec_functors.h) run on the host: every dtype x op of
// reduce_cuda, every dtype of scale_avg_cuda, every codec kernel; counts 0, 1,
// odd and a few million; in place and out of place; 16-byte aligned, shifted by
// one element (scalar head and tail), and with misalignments that never meet
// (the element-wise kernel). Bitwise, except that a NaN result needs only be a
// NaN: IEEE 754 leaves its payload open, and the GPU's arithmetic returns its
// canonical NaN where x86 keeps an operand's. Guard bytes around every buffer
// catch writes outside it. Then the memory wrappers the CUDA paths use.
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <type_traits>

#include "../edge_floats.h"
#include "codec_cuda.h"
#include "codec_functors.h"
#include "gpu_test.h"
#include "reduce_cuda.h"
#include "tandem/errors.h"

namespace tandem::gpu_test {
namespace {

using fn::bf16_t;
using fn::f16_t;

template <class T>
uint64_t bits(T x) {
  uint64_t u = 0;
  std::memcpy(&u, &x, sizeof x);
  return u;
}

template <class T>
bool nan_value(T x) {
  if constexpr (std::is_same_v<T, f16_t>) {
    return (x.bits & 0x7FFFu) > 0x7C00u;
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    return (x.bits & 0x7FFFu) > 0x7F80u;
  } else if constexpr (std::is_floating_point_v<T>) {
    return x != x;
  } else {
    return false;
  }
}

template <class T>
bool same(T got, T want) {
  return bits(got) == bits(want) || (nan_value(got) && nan_value(want));
}

template <class T>
std::string hex(T x) {
  std::ostringstream s;
  s << "0x" << std::hex << bits(x);
  return s.str();
}

// A value of every class: mostly moderate (sums and products round rather than
// overflow), some raw bit patterns (NaN payloads, inf, subnormals), and
// hand-picked ones at the 16-bit formats' edges and ties.
template <class T>
T random_value(std::mt19937_64& rng) {
  const uint64_t r = rng();
  const int kind = static_cast<int>(rng() % 20);
  if constexpr (std::is_integral_v<T>) {
    return kind < 10 ? static_cast<T>(static_cast<int64_t>(r % 201) - 100) : static_cast<T>(r);
  } else {
    const std::vector<float>& edges = testing::edge_floats();
    float f;
    if (kind < 14) {
      f = std::ldexp(1.0f + static_cast<float>(r % (1u << 20)) / (1u << 20), static_cast<int>(r >> 60) - 8);
      if ((r >> 59) & 1) f = -f;
    } else if (kind < 18) {
      T raw;
      std::memcpy(&raw, &r, sizeof raw);
      return raw;
    } else {
      f = edges[r % edges.size()];
    }
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      return static_cast<T>(f);
    } else {
      return fn::Arith<T>::narrow(f);
    }
  }
}

template <class T>
std::vector<T> random_values(size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  for (T& x : v) x = random_value<T>(rng);
  return v;
}

std::vector<size_t> counts_for(const CheckOptions& options) {
  if (options.quick) return {0, 1, 3, 17, 1001};
  return {0, 1, 3, 1001, 65537, 3000017};
}

// Where a case puts its arrays: shifts in elements past a 256-byte boundary.
struct Layout {
  const char* name;
  size_t shift_out, shift_in, shift_other;
  bool in_place;  // the output is the first input
};

const Layout kLayouts[] = {
    {"aligned, out of place", 0, 0, 0, false},
    {"aligned, in place", 0, 0, 0, true},
    {"shifted one element, out of place", 1, 1, 1, false},
    {"shifted one element, in place", 1, 1, 1, true},
    {"one input shifted (element-wise kernel)", 0, 1, 0, false},
};

// Compares got with want; "" when equal, else the first differences.
template <class T>
std::string compare(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  size_t bad = 0;
  std::ostringstream s;
  for (size_t i = 0; i < want.size(); ++i) {
    if (same(got[i], want[i])) continue;
    if (bad < 3) s << (bad ? "; " : "") << what << "[" << i << "] = " << hex(got[i]) << ", want " << hex(want[i]);
    ++bad;
  }
  if (!bad) return "";
  s << " (" << bad << " of " << want.size() << " differ)";
  return s.str();
}

std::string describe(const std::string& what, size_t n, const Layout& layout) {
  std::ostringstream s;
  s << what << ", " << n << " elements, " << layout.name;
  return s.str();
}

template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  b.download(v.data());
  return v;
}

// Waits for the kernel, then records one case: check() compares the outputs
// ("" when right), then the guards around every buffer are looked at.
template <class Check>
void finish_case(CheckReport& report, const std::string& kernel, const std::string& what,
                 std::initializer_list<const DeviceBuffer*> buffers, Check&& check) {
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  std::string problem = check();
  for (const DeviceBuffer* b : buffers) {
    if (problem.empty() && !b->guards_intact()) problem = "wrote outside its buffer";
  }
  report.record(kernel, problem.empty() ? "" : what + ": " + problem);
}

template <class T, class F>
std::vector<T> apply(F f, const std::vector<T>& a, const std::vector<T>& b, size_t n) {
  std::vector<T> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = f(a[i], b[i]);
  return r;
}

template <class T>
std::vector<T> host_reduce(ReduceOp op, const std::vector<T>& a, const std::vector<T>& b, size_t n) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return apply(fn::Sum{}, a, b, n);
    case ReduceOp::prod: return apply(fn::Prod{}, a, b, n);
    case ReduceOp::min: return apply(fn::Min{}, a, b, n);
    case ReduceOp::max: return apply(fn::Max{}, a, b, n);
  }
  return {};
}

template <class T>
void check_reduce(DataType dtype, const std::vector<size_t>& counts, std::mt19937_64& rng, CheckReport& report) {
  const std::string kernel = name_of("reduce_cuda", dtype);
  const std::vector<T> a = random_values<T>(counts.back(), rng), b = random_values<T>(counts.back(), rng);
  for (ReduceOp op : kAllReduceOps) {
    for (size_t n : counts) {
      const std::vector<T> want = host_reduce(op, a, b, n);
      for (const Layout& layout : kLayouts) {
        const size_t bytes = n * sizeof(T);
        DeviceBuffer da(bytes, layout.shift_in * sizeof(T)), db(bytes, layout.shift_other * sizeof(T)),
            dd(bytes, layout.shift_out * sizeof(T));
        da.upload(a.data());
        db.upload(b.data());
        DeviceBuffer& out = layout.in_place ? da : dd;
        detail::reduce_cuda(dtype, op, out.data(), da.data(), db.data(), n, nullptr);
        finish_case(report, kernel, describe(std::string(to_string(op)), n, layout), {&da, &db, &dd},
                    [&] { return compare(download<T>(out, n), want, "dst"); });
      }
    }
  }
}

template <class T>
void check_scale_avg(DataType dtype, const std::vector<size_t>& counts, std::mt19937_64& rng, CheckReport& report) {
  const std::string kernel = name_of("scale_avg_cuda", dtype);
  const std::vector<T> x = random_values<T>(counts.back(), rng);
  for (int divisor : {1, 3, 8}) {
    for (size_t n : counts) {
      std::vector<T> want(x.begin(), x.begin() + n);
      for (T& v : want) v = fn::AvgDiv{divisor}(v);
      for (const Layout& layout : {kLayouts[1], kLayouts[3]}) {  // in place only: aligned and shifted
        DeviceBuffer d(n * sizeof(T), layout.shift_out * sizeof(T));
        d.upload(x.data());
        detail::scale_avg_cuda(dtype, d.data(), n, divisor, nullptr);
        finish_case(report, kernel, describe("divisor " + std::to_string(divisor), n, layout), {&d},
                    [&] { return compare(download<T>(d, n), want, "data"); });
      }
    }
  }
  bool refused = false;
  try {
    DeviceBuffer d(sizeof(T));
    detail::scale_avg_cuda(dtype, d.data(), 1, 0, nullptr);
  } catch (const InvalidArgument&) {
    refused = true;
  }
  report.record(kernel, refused ? "" : "a divisor of 0 was not refused with InvalidArgument");
}

// The codec's 16-bit codes on the host: T's bits as uint16_t.
template <class T>
std::vector<uint16_t> as_bits(const std::vector<T>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i].bits;
  return out;
}

template <class T>
std::vector<T> as_codes(const std::vector<uint16_t>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = T{v[i]};
  return out;
}

template <class T>
void check_codec(codec::Format format, const char* name, const std::vector<size_t>& counts, std::mt19937_64& rng,
                 CheckReport& report) {
  const size_t max_n = counts.back();
  const std::vector<float> x = random_values<float>(max_n, rng);
  std::vector<float> r0(max_n);  // residuals of every magnitude, finite
  for (float& r : r0) r = std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, -static_cast<int>(rng() % 40) - 10);
  std::vector<uint16_t> codes(max_n);  // every 16-bit pattern, cycled
  for (size_t i = 0; i < max_n; ++i) codes[i] = static_cast<uint16_t>(i * 40503u);

  for (float scale : {1.0f, 1.0f / 3.0f, 3.0f}) {
    const std::string at_scale = "scale " + std::to_string(scale);
    for (size_t n : counts) {
      for (const Layout& layout : kLayouts) {
        if (layout.in_place) continue;  // the codec's arrays have different types: never in place
        const std::string what = describe(at_scale, n, layout);
        {
          std::vector<T> want(n);
          for (size_t i = 0; i < n; ++i) want[i] = codec::Encode<T>{scale}(x[i]);
          DeviceBuffer src(n * 4, layout.shift_in * 4), dst(n * 2, layout.shift_out * 2);
          src.upload(x.data());
          codec::encode_cuda(format, static_cast<const float*>(src.data()), static_cast<uint16_t*>(dst.data()), n,
                             scale, nullptr);
          finish_case(report, std::string("encode_cuda ") + name, what, {&src, &dst},
                      [&] { return compare(as_codes<T>(download<uint16_t>(dst, n)), want, "code"); });
        }
        {
          std::vector<float> want(n);
          for (size_t i = 0; i < n; ++i) want[i] = codec::Decode<T>{scale}(T{codes[i]});
          DeviceBuffer src(n * 2, layout.shift_in * 2), dst(n * 4, layout.shift_out * 4);
          src.upload(codes.data());
          codec::decode_cuda(format, static_cast<const uint16_t*>(src.data()), static_cast<float*>(dst.data()), n,
                             scale, nullptr);
          finish_case(report, std::string("decode_cuda ") + name, what, {&src, &dst},
                      [&] { return compare(download<float>(dst, n), want, "value"); });
        }
        {  // error feedback: data (first input), residual (the other), codes (the output)
          std::vector<float> data(x.begin(), x.begin() + n), residual(r0.begin(), r0.begin() + n);
          std::vector<T> want(n);
          const codec::EncodeFeedback<T> f{scale, 1.0f / scale};
          for (size_t i = 0; i < n; ++i) want[i] = f(data[i], residual[i]);
          DeviceBuffer dd(n * 4, layout.shift_in * 4), dr(n * 4, layout.shift_other * 4),
              dst(n * 2, layout.shift_out * 2);
          dd.upload(x.data());
          dr.upload(r0.data());
          codec::encode_feedback_cuda(format, static_cast<float*>(dd.data()), static_cast<float*>(dr.data()),
                                      static_cast<uint16_t*>(dst.data()), n, scale, 1.0f / scale, nullptr);
          finish_case(report, std::string("encode_feedback_cuda ") + name, what, {&dd, &dr, &dst}, [&] {
            std::string problem = compare(as_codes<T>(download<uint16_t>(dst, n)), want, "code");
            if (problem.empty()) problem = compare(download<float>(dd, n), data, "data");
            if (problem.empty()) problem = compare(download<float>(dr, n), residual, "residual");
            return problem;
          });
        }
      }
    }
  }

  // all_finite: finite codes, then one inf or NaN planted at the start, middle or end, then every pattern.
  const std::string kernel = std::string("all_finite_cuda ") + name;
  std::vector<T> finite(max_n);
  for (size_t i = 0; i < max_n; ++i) finite[i] = fn::Arith<T>::narrow(std::ldexp(static_cast<float>(i % 1000), -5));
  const T inf = fn::Arith<T>::narrow(HUGE_VALF), nan = T{static_cast<uint16_t>(codec::kExponentBits<T> | 1u)};
  for (size_t n : counts) {
    for (size_t shift : {0, 1}) {
      const Layout& layout = kLayouts[shift ? 2 : 0];
      std::vector<std::pair<std::string, std::vector<uint16_t>>> inputs;
      inputs.push_back({"all finite", as_bits(std::vector<T>(finite.begin(), finite.begin() + n))});
      for (size_t at : {size_t{0}, n / 2, n - 1}) {
        if (n == 0) break;
        for (T bad : {inf, nan}) {
          std::vector<T> v(finite.begin(), finite.begin() + n);
          v[at] = bad;
          inputs.push_back({(nan_value(bad) ? "NaN at " : "inf at ") + std::to_string(at), as_bits(v)});
        }
      }
      inputs.push_back({"every pattern", std::vector<uint16_t>(codes.begin(), codes.begin() + n)});
      for (const auto& [what, input] : inputs) {
        bool want = true;
        for (uint16_t c : input) want = want && !codec::nonfinite(T{c});
        DeviceBuffer src(n * 2, shift * 2);
        src.upload(input.data());
        const bool got = codec::all_finite_cuda(format, static_cast<const uint16_t*>(src.data()), n, nullptr);
        finish_case(report, kernel, describe(what, n, layout), {&src},
                    [&] { return got == want ? std::string() : std::string("returned ") + (got ? "true" : "false"); });
      }
    }
  }
}

// The thin wrappers the collectives' CUDA paths use (reduce_cuda.h):
// allocate_cuda, copy_cuda in every direction on the default stream and on a
// stream of its own, synchronize_cuda, free_cuda; bytes moved must arrive
// unchanged, and an impossible allocation must throw tandem::Error.
void check_memory(const CheckOptions& options, std::mt19937_64& rng, CheckReport& report) {
  const char* kernel = "allocate/copy/synchronize";
  const std::vector<size_t> sizes =
      options.quick ? std::vector<size_t>{0, 1, 4097} : std::vector<size_t>{0, 1, 4097, (size_t{3} << 20) + 7};
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (size_t bytes : sizes) {
    for (void* s : {static_cast<void*>(nullptr), static_cast<void*>(stream)}) {
      const std::vector<uint8_t> input = random_values<uint8_t>(bytes, rng);
      std::vector<uint8_t> output(bytes, 0);
      void* device = detail::allocate_cuda(bytes);
      DeviceBuffer shifted(bytes, 1);                       // the device-to-device copy lands one byte off a boundary
      detail::copy_cuda(device, input.data(), bytes, s);    // host to device
      detail::copy_cuda(shifted.data(), device, bytes, s);  // device to device
      detail::copy_cuda(device, device, bytes, s);          // the same pointer: nothing to do
      detail::copy_cuda(output.data(), shifted.data(), bytes, s);  // device to host
      detail::synchronize_cuda(s);
      detail::free_cuda(device);
      const std::string what = std::to_string(bytes) + " bytes, " + (s ? "own stream" : "default stream");
      finish_case(report, kernel, what, {&shifted},
                  [&] { return output == input ? std::string() : std::string("bytes changed on the way"); });
    }
  }
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  if (options.quick) return;  // compute-sanitizer (which runs --quick) reports the failed cudaMalloc as an error
  bool refused = false;
  try {
    detail::free_cuda(detail::allocate_cuda(size_t{1} << 52));  // 4 PiB
  } catch (const Error&) {
    refused = true;
  }
  (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
  report.record(kernel, refused ? "" : "allocating 4 PiB did not throw tandem::Error");
}

}  // namespace

CheckReport run_checks(const CheckOptions& options) {
  CheckReport report;
  std::mt19937_64 rng(options.seed);
  const std::vector<size_t> counts = counts_for(options);
  for (DataType dtype : kAllDataTypes) {
    with_type(dtype, [&](auto t) { check_reduce<decltype(t)>(dtype, counts, rng, report); });
  }
  for (DataType dtype : kAllDataTypes) {
    with_type(dtype, [&](auto t) { check_scale_avg<decltype(t)>(dtype, counts, rng, report); });
  }
  check_codec<f16_t>(codec::Format::f16, "fp16", counts, rng, report);
  check_codec<bf16_t>(codec::Format::bf16, "bf16", counts, rng, report);
  check_memory(options, rng, report);
  return report;
}

}  // namespace tandem::gpu_test
