// Shared pieces of the GPU test tier (tests/gpu): CUDA error checks, guarded
// device buffers, the element types by name, and the records the correctness
// checks and the bandwidth runs hand to main.cu for the table.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/reduce/functors.h"
#include "tandem/types.h"

namespace tandem::gpu_test {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}
#define TANDEM_CUDA_CHECK(call) ::tandem::gpu_test::check_cuda((call), #call)

// Device memory with kGuard poisoned bytes on either side of the data, which
// starts `shift` bytes past a 256-byte boundary: a kernel that writes outside
// its elements is caught, and misaligned layouts are made on purpose.
class DeviceBuffer {
 public:
  static constexpr size_t kGuard = 256;
  static constexpr unsigned char kPoison = 0xA5;

  explicit DeviceBuffer(size_t bytes, size_t shift = 0) : bytes_(bytes), shift_(shift) {
    TANDEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), total()));
    TANDEM_CUDA_CHECK(cudaMemset(base_, kPoison, total()));
  }
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return base_ + kGuard + shift_; }
  void upload(const void* src) {
    if (bytes_) TANDEM_CUDA_CHECK(cudaMemcpy(data(), src, bytes_, cudaMemcpyHostToDevice));
  }
  void download(void* dst) const {
    if (bytes_) TANDEM_CUDA_CHECK(cudaMemcpy(dst, data(), bytes_, cudaMemcpyDeviceToHost));
  }

  // Whether every byte outside [data(), data() + bytes) still holds the poison.
  bool guards_intact() const {
    std::vector<unsigned char> before(kGuard + shift_), after(kGuard);
    TANDEM_CUDA_CHECK(cudaMemcpy(before.data(), base_, before.size(), cudaMemcpyDeviceToHost));
    TANDEM_CUDA_CHECK(cudaMemcpy(after.data(), base_ + kGuard + shift_ + bytes_, after.size(), cudaMemcpyDeviceToHost));
    const auto poisoned = [](const std::vector<unsigned char>& v) {
      return std::all_of(v.begin(), v.end(), [](unsigned char c) { return c == kPoison; });
    };
    return poisoned(before) && poisoned(after);
  }

 private:
  size_t total() const { return kGuard + shift_ + bytes_ + kGuard; }
  unsigned char* base_ = nullptr;
  size_t bytes_, shift_;
};

// Calls f(T{}) for the storage type of dtype.
template <class F>
void with_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::f32: return f(float{});
    case DataType::f64: return f(double{});
    case DataType::f16: return f(fn::f16_t{});
    case DataType::bf16: return f(fn::bf16_t{});
    case DataType::i32: return f(int32_t{});
    case DataType::i64: return f(int64_t{});
    case DataType::u8: return f(uint8_t{});
  }
}

// "reduce_cuda sum f16" and the like (to_string comes from comm/src/type_names.cc).
inline std::string name_of(const char* kernel, DataType dtype) {
  return kernel + (" " + std::string(to_string(dtype)));
}

// One kernel family's correctness: cases run and failed, and what the first failures were.
struct CheckRow {
  std::string kernel;  // "reduce f16", "encode bf16", ...
  int cases = 0;
  int failed = 0;
};

struct CheckReport {
  std::vector<CheckRow> rows;
  std::vector<std::string> failures;  // one line each, the first few kept

  CheckRow& row(const std::string& kernel) {
    for (CheckRow& r : rows)
      if (r.kernel == kernel) return r;
    rows.push_back({kernel});
    return rows.back();
  }
  // Counts a case; `problem` empty means it passed.
  void record(const std::string& kernel, const std::string& problem) {
    CheckRow& r = row(kernel);
    ++r.cases;
    if (problem.empty()) return;
    ++r.failed;
    if (failures.size() < 20) failures.push_back(kernel + ": " + problem);
  }
  int failed() const {
    int n = 0;
    for (const CheckRow& r : rows) n += r.failed;
    return n;
  }
};

struct CheckOptions {
  bool quick = false;  // small counts only (e.g. under compute-sanitizer)
  uint64_t seed = 20261128;
};

CheckReport run_checks(const CheckOptions& options);

// One kernel's bandwidth at each size: bytes read and written per second.
struct BandwidthRow {
  std::string kernel;
  bool target = false;       // held to the roofline target
  std::vector<double> gbps;  // per size; 0 where not measured
};

struct BandwidthReport {
  std::vector<size_t> sizes;  // bytes of the kernel's f32-sized array (the copy's bytes)
  BandwidthRow copy;
  std::vector<BandwidthRow> rows;
};

struct BandwidthOptions {
  bool quick = false;  // sizes up to 64 MiB
  int samples = 15;
};

BandwidthReport run_bandwidth(const BandwidthOptions& options);

}  // namespace tandem::gpu_test
