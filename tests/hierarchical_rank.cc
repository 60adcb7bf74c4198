// One rank of the hierarchical all-reduce tests (run by hierarchical_test in
// network namespaces; bootstrap from the environment, algorithm from
// TANDEM_ALGO). For every case it all-reduces two inputs and prints
//   case <name> wrong <n> digest <hex>
// `wrong`: elements of the integer-valued input that differ from the closed
// form; `digest`: FNV-1a of the result of the fractional input, whose bits
// depend on the order of the additions, so equal digests on every rank mean
// bitwise-identical results. First line: "topology <...> local <l>/<L>".
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/bootstrap.h"
#include "tandem/ring/ring.h"

namespace {

using tandem::DataType;
using tandem::ReduceOp;

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Case {
  const char* name;
  size_t count;
  DataType dtype;
  ReduceOp op;
  bool in_place;
};

// Integer-valued input of rank r at i: (r + 1) * (i % 7 + 1); its closed forms over n ranks.
double exact_input(int r, size_t i) { return double(r + 1) * double(i % 7 + 1); }
double exact_result(ReduceOp op, int n, size_t i) {
  const double k = double(i % 7 + 1);
  if (op == ReduceOp::max) return k * n;
  if (op == ReduceOp::avg) return k * (n + 1) / 2.0;
  return k * n * (n + 1) / 2.0;  // sum
}
// Fractional input: rounding differs with the order of the additions.
double fractional_input(int r, size_t i) { return 0.1 * (r + 1) + 0.37 * double(i % 101) + 1e-3 * double(i % 13); }

template <class T>
void run_case(tandem::Communicator& comm, const Case& c) {
  const int n = comm.size(), r = comm.rank();
  std::vector<T> in(c.count), out(c.count);
  // The exact check.
  for (size_t i = 0; i < c.count; ++i) in[i] = T(exact_input(r, i));
  T* dst = c.in_place ? in.data() : out.data();
  comm.allreduce(in.data(), dst, c.count, c.dtype, c.op);
  size_t wrong = 0;
  for (size_t i = 0; i < c.count; ++i) {
    // avg of integers: the integer kernels truncate, as every path does.
    const double want = std::is_integral_v<T> ? double(T(exact_result(c.op, n, i))) : exact_result(c.op, n, i);
    if (double(dst[i]) != want) ++wrong;
  }
  // The bitwise check.
  for (size_t i = 0; i < c.count; ++i) in[i] = T(fractional_input(r, i) * (std::is_integral_v<T> ? 1000 : 1));
  comm.allreduce(in.data(), dst, c.count, c.dtype, c.op);
  std::printf("case %s wrong %zu digest %016llx\n", c.name, wrong, (unsigned long long)fnv1a(dst, c.count * sizeof(T)));
}

}  // namespace

int main() {
  try {
    auto comm = tandem::ring::connect_from_env();
    const auto& t = comm->topology();
    std::printf("topology %s local %d/%d transports %s\n", t.str().c_str(), t.local_rank(), t.local_size(),
                comm->transport_summary().c_str());
    const Case cases[] = {
        {"f32_sum_1", 1, DataType::f32, ReduceOp::sum, true},
        {"f32_sum_1001_out", 1001, DataType::f32, ReduceOp::sum, false},
        {"f32_sum_4M", 1 << 20, DataType::f32, ReduceOp::sum, true},
        {"f32_sum_3M_odd_out", 786433, DataType::f32, ReduceOp::sum, false},
        {"f64_avg_100003", 100003, DataType::f64, ReduceOp::avg, true},
        {"i32_max_65537", 65537, DataType::i32, ReduceOp::max, true},
    };
    for (const Case& c : cases) {
      switch (c.dtype) {
        case DataType::f64: run_case<double>(*comm, c); break;
        case DataType::i32: run_case<int32_t>(*comm, c); break;
        default: run_case<float>(*comm, c); break;
      }
    }
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hierarchical_rank: %s\n", e.what());
    return 1;
  }
}
