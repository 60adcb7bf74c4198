// The torch backend's conversions: torch's dtypes and reduce ops as
// tandem's, and tensors as runs of elements or bytes and back.
#pragma once

#include <torch/extension.h>

#include <functional>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "tandem/tandem.h"

namespace tandem::c10d_backend {

inline tandem::DataType to_tandem(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return tandem::DataType::f32;
    case at::kDouble: return tandem::DataType::f64;
    case at::kHalf: return tandem::DataType::f16;
    case at::kBFloat16: return tandem::DataType::bf16;
    case at::kInt: return tandem::DataType::i32;
    case at::kLong: return tandem::DataType::i64;
    case at::kByte: return tandem::DataType::u8;
    case at::kBool: return tandem::DataType::u8;  // broadcast and allgather only (checked below)
    default:
      TORCH_CHECK(false, "tandem backend: tensors of ", t.scalar_type(),
                  " are not supported; use float32, float64, float16, bfloat16, int32, int64, uint8 or bool");
  }
}

inline tandem::ReduceOp to_tandem(const c10d::ReduceOp& op) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return tandem::ReduceOp::sum;
    case c10d::ReduceOp::AVG: return tandem::ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT: return tandem::ReduceOp::prod;
    case c10d::ReduceOp::MIN: return tandem::ReduceOp::min;
    case c10d::ReduceOp::MAX: return tandem::ReduceOp::max;
    default:
      TORCH_CHECK(false, "tandem backend: reduce op ", int(static_cast<c10d::ReduceOp::RedOpType>(op)),
                  " is not supported; use SUM, AVG, PRODUCT, MIN or MAX");
  }
}

inline void check_cpu(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.device().is_cpu(), "tandem backend: ", call, " needs CPU tensors (got ", t.device(),
              "); tandem's CUDA kernels are not wired into the torch backend");
}

inline at::Tensor single(std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "tandem backend: ", call, " takes one tensor per rank (got ", tensors.size(), ")");
  check_cpu(tensors[0], call);
  return tensors[0];
}

inline tandem::CollectiveOptions with_timeout(std::chrono::milliseconds timeout) {
  tandem::CollectiveOptions o;
  if (timeout != c10d::kUnsetTimeout) o.timeout = timeout;
  return o;
}

// Broadcast and allgather move bytes: any dtype, bool included.
inline size_t bytes_as_count(const at::Tensor& t) { return size_t(t.numel()) * t.element_size(); }
inline tandem::DataType byte_type(const at::Tensor&) { return tandem::DataType::u8; }

inline std::vector<at::Tensor> flatten_all(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return flat;
}

// A non-contiguous tensor was staged in a contiguous copy: copy the result back.
inline std::function<void()> copy_back(at::Tensor target, at::Tensor staged) {
  if (target.data_ptr() == staged.data_ptr()) return nullptr;
  return [target, staged]() mutable { target.copy_(staged); };
}

// Tensors as one run of bytes each, and back (any dtype, bool included).
inline std::vector<at::Tensor> flatten_bytes(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.contiguous().view({-1}).view(at::kByte));
  return flat;
}
inline void unflatten_bytes(const at::Tensor& bytes, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (auto& t : tensors) {
    const int64_t n = int64_t(bytes_as_count(t));
    t.copy_(bytes.narrow(0, offset, n).view(t.scalar_type()).view(t.sizes()));
    offset += n;
  }
}

}  // namespace tandem::c10d_backend
