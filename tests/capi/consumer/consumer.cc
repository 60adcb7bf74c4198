// Links the installed libtandem through find_package(tandem); the C++ API.
#include <tandem/tandem.h>

#include <cstdio>
#include <vector>

int main() {
  auto comm = tandem::ring::connect_from_env();
  std::vector<double> x(1000, comm->rank() + 1.0);
  comm->allreduce(x.data(), x.size(), tandem::DataType::f64, tandem::ReduceOp::avg);
  const double want = (comm->size() + 1) / 2.0;
  int wrong = 0;
  for (double v : x) wrong += v != want;
  std::printf("consumer_cpp: rank %d of %d: avg %g, wrong %d\n", comm->rank(), comm->size(), x[0], wrong);
  return wrong != 0;
}
