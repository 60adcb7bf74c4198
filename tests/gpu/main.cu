// tandem-gpu-kernels: the GPU test tier's one program. Checks every CUDA
// kernel against the CPU functors, then times each against a device-to-device
// copy, and prints one table. Exit status: 0 all correct, 1 a mismatch or a
// CUDA error, 77 no GPU (tests/gpu/run.sh turns that into "built only").
//
//   tandem-gpu-kernels [--quick] [--check-only | --bandwidth-only] [--samples N] [--json FILE]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "gpu_test.h"

namespace tandem::gpu_test {
namespace {

constexpr int kNoGpu = 77;
constexpr double kTarget = 0.85;          // of the copy's bandwidth ...
constexpr size_t kTargetFrom = 64 << 20;  // ... from this size

struct Options {
  bool quick = false, check = true, bandwidth = true;
  int samples = 15;
  std::string json;
};

void usage() {
  std::fprintf(stderr,
               "usage: tandem-gpu-kernels [--quick] [--check-only | --bandwidth-only] [--samples N] [--json FILE]\n"
               "  --quick           small counts (0..1001) and sizes up to 64 MiB, e.g. under compute-sanitizer\n"
               "  --samples N       timed samples per kernel and size; the median is reported (default 15)\n"
               "  --json FILE       also write every result as JSON lines\n");
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--check-only") {
      o.bandwidth = false;
    } else if (a == "--bandwidth-only") {
      o.check = false;
    } else if (a == "--samples" && i + 1 < argc) {
      o.samples = std::atoi(argv[++i]);
      if (o.samples < 1) return false;
    } else if (a == "--json" && i + 1 < argc) {
      o.json = argv[++i];
    } else {
      std::fprintf(stderr, "tandem-gpu-kernels: unknown or incomplete argument '%s'\n", a.c_str());
      return false;
    }
  }
  return true;
}

std::string size_name(size_t bytes) {
  return bytes >= (size_t{1} << 30) ? std::to_string(bytes >> 30) + " GiB" : std::to_string(bytes >> 20) + " MiB";
}

// The device's name and versions, printed first and written to the JSON log.
std::string describe_device(std::ofstream& json) {
  int device = 0, driver = 0, runtime = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p{};
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  TANDEM_CUDA_CHECK(cudaDriverGetVersion(&driver));
  TANDEM_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  char line[512];
  std::snprintf(line, sizeof line,
                "%s, compute capability %d.%d, %d multiprocessors, %.0f MiB L2, %.1f GiB; CUDA driver %d.%d, "
                "runtime %d.%d",
                p.name, p.major, p.minor, p.multiProcessorCount, p.l2CacheSize / 1048576.0,
                p.totalGlobalMem / 1073741824.0, driver / 1000, driver % 1000 / 10, runtime / 1000,
                runtime % 1000 / 10);
  if (json.is_open()) {
    json << "{\"kind\":\"device\",\"name\":\"" << p.name << "\",\"compute_capability\":\"" << p.major << "." << p.minor
         << "\",\"multiprocessors\":" << p.multiProcessorCount << ",\"l2_bytes\":" << p.l2CacheSize
         << ",\"driver\":" << driver << ",\"runtime\":" << runtime << "}\n";
  }
  return line;
}

int print_checks(const CheckReport& r, std::ofstream& json) {
  std::printf("\nCorrectness against the CPU functors (bitwise; a NaN result needs only be a NaN)\n");
  std::printf("  %-28s %8s %8s\n", "kernel", "cases", "failed");
  for (const CheckRow& row : r.rows) {
    std::printf("  %-28s %8d %8d%s\n", row.kernel.c_str(), row.cases, row.failed, row.failed ? "  MISMATCH" : "");
    if (json.is_open()) {
      json << "{\"kind\":\"check\",\"kernel\":\"" << row.kernel << "\",\"cases\":" << row.cases
           << ",\"failed\":" << row.failed << "}\n";
    }
  }
  for (const std::string& f : r.failures) std::printf("  FAIL %s\n", f.c_str());
  const int failed = r.failed();
  int cases = 0;
  for (const CheckRow& row : r.rows) cases += row.cases;
  std::printf("  %s: %d of %d cases correct\n", failed ? "FAILED" : "all correct", cases - failed, cases);
  return failed;
}

void print_bandwidth(const BandwidthReport& r, std::ofstream& json) {
  std::printf("\nBandwidth, bytes read + written per second, as a share of the device copy's (median of samples)\n");
  std::printf("  %-28s", "kernel");
  for (size_t s : r.sizes) std::printf(" %11s", size_name(s).c_str());
  std::printf("\n  %-28s", "copy (GB/s)");
  for (double g : r.copy.gbps) std::printf(" %11.0f", g);
  std::printf("\n");
  std::vector<std::string> missed;
  for (const BandwidthRow& row : r.rows) {
    std::printf("  %-28s", row.kernel.c_str());
    for (size_t k = 0; k < r.sizes.size(); ++k) {
      const double share = row.gbps[k] / r.copy.gbps[k];
      std::printf(" %5.0f %4.0f%%", row.gbps[k], 100 * share);
      if (row.target && r.sizes[k] >= kTargetFrom && share < kTarget) {
        missed.push_back(row.kernel + " at " + size_name(r.sizes[k]));
      }
      if (json.is_open()) {
        json << "{\"kind\":\"bandwidth\",\"kernel\":\"" << row.kernel << "\",\"bytes\":" << r.sizes[k]
             << ",\"gbps\":" << row.gbps[k] << ",\"copy_gbps\":" << r.copy.gbps[k] << ",\"share\":" << share << "}\n";
      }
    }
    std::printf("%s\n", row.target ? "  *" : "");
  }
  std::printf("  cells: GB/s and the share of the copy at that size; below the L2's size both run from the L2\n");
  std::printf("  * held to >= %.0f%% of the copy from %s: ", 100 * kTarget, size_name(kTargetFrom).c_str());
  if (r.sizes.back() < kTargetFrom) {
    std::printf("not measured (--quick)\n");
  } else if (missed.empty()) {
    std::printf("met by every such kernel at every such size\n");
  } else {
    std::printf("missed by");
    for (const std::string& m : missed) std::printf(" [%s]", m.c_str());
    std::printf("\n");
  }
}

int run(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    usage();
    return 2;
  }
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("no CUDA GPU found (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return kNoGpu;
  }
  std::ofstream json;
  if (!o.json.empty()) json.open(o.json);
  std::printf("GPU: %s\n", describe_device(json).c_str());
  std::fflush(stdout);
  int failed = 0;
  if (o.check) failed = print_checks(run_checks({o.quick}), json);
  std::fflush(stdout);
  if (o.bandwidth) print_bandwidth(run_bandwidth({o.quick, o.samples}), json);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace tandem::gpu_test

int main(int argc, char** argv) {
  try {
    return tandem::gpu_test::run(argc, argv);
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
}
