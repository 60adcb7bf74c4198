// nccl-tests-style sweep: for each size, an optional checked run, warm-up,
// then a timed loop of back-to-back collectives between two barriers. The time
// reported is the slowest rank's mean per operation (a collective is only done
// when every rank is). busbw = algbw * factor, with nccl-tests' factors.
#include "tandem/bench/sweep.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include "tandem/bench/check.h"
#include "tandem/tandem.h"

namespace tandem::bench {
namespace {

struct Result {
  size_t bytes = 0;
  size_t count = 0;
  bool inplace = false;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  long wrong = -1;  // -1: not checked
};

double bus_factor(const std::string& collective, int n) {
  if (collective == "allreduce") return 2.0 * (n - 1) / n;
  if (collective == "reduce_scatter" || collective == "allgather") return double(n - 1) / n;
  return 1.0;
}

std::vector<size_t> sizes_of(const SweepOptions& o, size_t esize) {
  std::vector<size_t> sizes;
  for (size_t b = o.min_bytes; b <= o.max_bytes;) {
    sizes.push_back(b / esize * esize);
    size_t next = o.increment ? b + o.increment : size_t(std::ceil(double(b) * o.factor));
    if (next <= b) break;
    b = next;
  }
  return sizes;
}

// One timed measurement: `iters` back-to-back operations between barriers.
double time_per_op_us(Communicator& comm, const std::function<void()>& op, int iters) {
  float token = 0;
  comm.allreduce(&token, 1, DataType::f32, ReduceOp::sum);  // barrier
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  comm.allreduce(&us, 1, DataType::f64, ReduceOp::max);  // the slowest rank decides
  return us;
}

Result measure(Communicator& comm, const SweepOptions& o, size_t bytes, bool inplace, std::vector<char>& in,
               std::vector<char>& out) {
  const size_t esize = dtype_size(o.dtype), count = bytes / esize;
  void* dst = inplace ? in.data() : out.data();
  auto fill = [&] {
    for (size_t i = 0; i < count; ++i) store_element(o.dtype, in.data(), i, input_value(o.op, o.dtype, comm.rank(), i));
  };
  auto op = [&] { comm.allreduce(in.data(), dst, count, o.dtype, o.op); };
  Result r;
  r.bytes = bytes;
  r.count = count;
  r.inplace = inplace;
  if (o.check) {
    fill();
    op();
    long wrong = count_wrong(o.op, o.dtype, comm.size(), dst, count);
    comm.allreduce(&wrong, 1, DataType::i64, ReduceOp::sum);
    r.wrong = wrong;
  }
  fill();  // keep values bounded across repeated in-place operations
  for (int i = 0; i < o.warmup; ++i) op();
  r.time_us = time_per_op_us(comm, op, std::max(1, o.iters));
  r.algbw = r.time_us > 0 ? double(bytes) / r.time_us / 1e3 : 0;
  r.busbw = r.algbw * bus_factor(o.collective, comm.size());
  return r;
}

void print_table_header(const SweepOptions& o, Communicator& comm) {
  printf("# tandem bench %s: %d ranks, dtype %s, op %s, %d iterations, %d warm-up, check %s\n",
         o.collective.c_str(), comm.size(), std::string(to_string(o.dtype)).c_str(),
         std::string(to_string(o.op)).c_str(), o.iters, o.warmup, o.check ? "on" : "off");
  printf("# transports: %s; reduce kernels: %s\n", comm.transport_summary().c_str(),
         std::string(reduce_isa()).c_str());
  printf("#\n#%64s%36s\n", "out-of-place", "in-place");
  printf("#%11s %12s %6s %6s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("#%11s %12s %6s %6s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::string wrong_text(long w) { return w < 0 ? "N/A" : std::to_string(w); }

void print_row(const SweepOptions& o, const Result& oop, const Result& ip) {
  if (o.format == Format::table) {
    printf("%12zu %12zu %6s %6s %6d %10.2f %8.2f %8.2f %6s %10.2f %8.2f %8.2f %6s\n", oop.bytes, oop.count,
           std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.op)).c_str(), -1, oop.time_us,
           oop.algbw, oop.busbw, wrong_text(oop.wrong).c_str(), ip.time_us, ip.algbw, ip.busbw,
           wrong_text(ip.wrong).c_str());
  } else if (o.format == Format::csv) {
    for (const Result* r : {&oop, &ip}) {
      printf("%s,%zu,%zu,%s,%s,%d,%d,%.3f,%.4f,%.4f,%ld\n", o.collective.c_str(), r->bytes, r->count,
             std::string(to_string(o.dtype)).c_str(), std::string(to_string(o.op)).c_str(), -1, r->inplace ? 1 : 0,
             r->time_us, r->algbw, r->busbw, r->wrong);
    }
  }
  fflush(stdout);
}

void print_json(const SweepOptions& o, int nranks, const Result& r) {
  nlohmann::json j = {{"collective", o.collective},
                      {"nranks", nranks},
                      {"bytes", r.bytes},
                      {"count", r.count},
                      {"dtype", std::string(to_string(o.dtype))},
                      {"op", std::string(to_string(o.op))},
                      {"root", -1},
                      {"inplace", r.inplace},
                      {"time_us", r.time_us},
                      {"algbw_gbps", r.algbw},
                      {"busbw_gbps", r.busbw},
                      {"wrong", r.wrong < 0 ? 0 : r.wrong},
                      {"checked", r.wrong >= 0}};
  printf("%s\n", j.dump().c_str());
  fflush(stdout);
}

// busbw against size, out-of-place and in-place, through gnuplot.
void plot(const SweepOptions& o, int nranks, const std::vector<Result>& results) {
  const std::string data = o.plot + ".dat";
  {
    std::ofstream f(data);
    // Two data blocks (gnuplot "index" 0 and 1): out-of-place, then in-place.
    for (bool inplace : {false, true}) {
      for (const auto& r : results) {
        if (r.inplace == inplace) f << r.bytes << ' ' << r.busbw << '\n';
      }
      f << "\n\n";
    }
  }
  // A script file, not -e: no shell quoting in between.
  const std::string script = o.plot + ".gp";
  {
    std::ofstream f(script);
    f << "set terminal pngcairo size 900,540\nset output '" << o.plot << "'\n"
      << "set logscale x 2\nset grid\nset format x '%.0b %BB'\nset yrange [0:*]\n"
      << "set xlabel 'message size'\nset ylabel 'bus bandwidth (GB/s)'\nset key left top\n"
      << "set title 'tandem " << o.collective << ", " << nranks << " ranks, " << to_string(o.dtype) << " "
      << to_string(o.op) << "'\n"
      << "plot '" << data << "' index 0 using 1:2 with linespoints title 'out-of-place', \\\n"
      << "     '" << data << "' index 1 using 1:2 with linespoints title 'in-place'\n";
  }
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::remove(data.c_str());
  std::remove(script.c_str());
  if (rc != 0) {
    fprintf(stderr, "tandem bench: gnuplot failed to write %s (is gnuplot-nox installed?)\n", o.plot.c_str());
  } else {
    fprintf(stderr, "tandem bench: wrote %s\n", o.plot.c_str());
  }
}

}  // namespace

int run_sweep(const SweepOptions& o) {
  if (o.collective != "allreduce") {
    throw InvalidArgument("tandem bench: collective '" + o.collective +
                          "' is not available in this build; available: allreduce");
  }
  if (o.min_bytes > o.max_bytes) throw InvalidArgument("tandem bench: -b must not exceed -e");
  if (o.increment == 0 && o.factor <= 1.0) throw InvalidArgument("tandem bench: -f must be > 1 (or use -i)");
  if (o.iters < 1 || o.warmup < 0) throw InvalidArgument("tandem bench: -n must be >= 1 and -w >= 0");

  auto comm = ring::connect_from_env();
  const bool printer = comm->rank() == 0;
  const size_t esize = dtype_size(o.dtype);
  if (printer && o.format == Format::table) print_table_header(o, *comm);
  if (printer && o.format == Format::csv) {
    printf("collective,bytes,count,dtype,op,root,inplace,time_us,algbw_gbps,busbw_gbps,wrong\n");
  }

  std::vector<Result> results;
  long total_wrong = 0;
  double busbw_sum = 0;
  int rows = 0;
  std::vector<char> in(o.max_bytes + esize), out(o.max_bytes + esize);
  for (size_t bytes : sizes_of(o, esize)) {
    Result oop = measure(*comm, o, bytes, false, in, out);
    Result ip = measure(*comm, o, bytes, true, in, out);
    total_wrong += std::max(0L, oop.wrong) + std::max(0L, ip.wrong);
    busbw_sum += oop.busbw + ip.busbw;
    rows += 2;
    results.push_back(oop);
    results.push_back(ip);
    if (!printer) continue;
    if (o.format == Format::json) {
      print_json(o, comm->size(), oop);
      print_json(o, comm->size(), ip);
    } else {
      print_row(o, oop, ip);
    }
  }
  if (printer && o.format == Format::table) {
    printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.4f GB/s\n#\n", rows ? busbw_sum / rows : 0.0);
  }
  if (printer && !o.plot.empty()) plot(o, comm->size(), results);
  return total_wrong ? 1 : 0;
}

}  // namespace tandem::bench
