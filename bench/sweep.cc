// nccl-tests-style sweep: for each size, an optional checked run, warm-up,
// then a timed loop of back-to-back collectives between two barriers. The time
// reported is the slowest rank's mean per operation (a collective is only done
// when every rank is). busbw = algbw * factor, with nccl-tests' factors.
//
// Sizes mean what nccl-tests prints: the bytes of a rank's largest buffer.
// For reduce_scatter, allgather, alltoall, gather and scatter that is nranks
// blocks of `count` elements (the count column is per rank; gather and scatter:
// the root's buffer); for allreduce, broadcast, reduce and sendrecv it is count
// elements. barrier moves no data: it is timed once, whatever the sizes. What
// differs between the collectives is one table (sweep_case.cc).
//
// --compress fp16|bf16 (all-reduce, f32, sum or avg) runs every all-reduce
// through compression::CompressedAllreduce. Sizes, algbw and busbw still count
// the f32 bytes handed in, so they compare directly with an uncompressed run;
// the wire column gives the 16-bit bytes reduced per operation. The compressed
// all-reduce works in place, so out-of-place is a copy of the input into the
// output followed by it. Inputs are gradient-like values in [-1, 1] (the
// closed-form integers would travel exactly), and the check compares the
// result with a plain f32 all-reduce of the same inputs: max and mean
// absolute error, and #wrong = elements beyond compression::error_bound.
// The timed in-place loop runs avg when sum was asked for: repeated in-place
// sums grow N-fold per call and would overflow fp16 within a few calls, and
// avg is the same work (only the postscale constant differs).
#include "tandem/bench/sweep.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sweep_case.h"
#include "tandem/bench/buffers.h"
#include "tandem/bench/check.h"
#include "tandem/bench/plot.h"
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
  // --compress: bytes reduced per timed operation (16-bit, plus f32 after a
  // fallback), fallbacks in the timed loop, and the checked run's error
  // against the f32 result (-1: not checked).
  double wire_bytes = 0;
  uint64_t fallbacks = 0;
  double max_error = -1, mean_error = -1;
  // Bytes read and written per payload byte by the busiest rank's shared-memory
  // collectives in the timed loop (Communicator::shared_memory_traffic); 0: none went through it.
  double traffic = 0;
};

std::string op_name(const SweepOptions& o) {
  return spec_of(o.collective).reduces ? std::string(to_string(o.op)) : "none";
}
int root_of(const SweepOptions& o) { return spec_of(o.collective).rooted() ? o.root : -1; }
bool is_barrier(const SweepOptions& o) { return !spec_of(o.collective).moves_data(); }

// Sizes rounded down to whole units of `unit` bytes (an element, or one per rank).
std::vector<size_t> sizes_of(const SweepOptions& o, size_t unit) {
  std::vector<size_t> sizes;
  for (size_t b = o.min_bytes; b <= o.max_bytes;) {
    sizes.push_back(b / unit * unit);
    size_t next = o.increment ? b + o.increment : size_t(std::ceil(double(b) * o.factor));
    if (next <= b) break;
    b = next;
  }
  return sizes;
}

bool compressing(const SweepOptions& o) { return o.compress != compression::Codec::none; }

// A placement the collective has no form for (sendrecv in place): not run, N/A in the table, no CSV or JSON row.
bool measured(const Result& r) { return r.time_us >= 0; }

// The checked run under --compress: the same inputs through a plain f32
// all-reduce give the reference, and sum |x| over ranks the error bound.
// Every rank ends with the same bits, so rank-local errors are everyone's.
void check_compressed(Communicator& comm, const SweepOptions& o, compression::CompressedAllreduce& compressed, Case& c,
                      Result& r) {
  const size_t n = c.count();
  std::vector<float> reference(c.input_f32(), c.input_f32() + n), magnitude(n);
  for (size_t i = 0; i < n; ++i) magnitude[i] = std::fabs(reference[i]);
  comm.allreduce(reference.data(), n, DataType::f32, o.op);
  comm.allreduce(magnitude.data(), n, DataType::f32, ReduceOp::sum);
  c.run();
  const double divisor = o.op == ReduceOp::avg ? comm.size() : 1;
  double max_error = 0, sum_error = 0;
  long wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const double error = std::fabs(double(c.output_f32()[i]) - reference[i]);
    const double bound =
        compression::error_bound(o.compress, comm.size(), compressed.predivide(), magnitude[i]) / divisor;
    max_error = std::max(max_error, error);
    sum_error += error;
    if (!(error <= bound + 4 * 0x1p-24 * std::fabs(reference[i]))) ++wrong;  // + the reference's own rounding
  }
  comm.allreduce(&wrong, 1, DataType::i64, ReduceOp::sum);
  r.wrong = wrong;
  r.max_error = max_error;
  r.mean_error = n ? sum_error / double(n) : 0;
}

Result measure(Communicator& comm, const SweepOptions& o, size_t bytes, bool inplace, char* in, char* out,
               compression::CompressedAllreduce* compressed = nullptr) {
  const Spec& spec = spec_of(o.collective);
  const size_t count = bytes / dtype_size(o.dtype) / spec.size_blocks(comm.size());
  Result r;
  r.bytes = bytes;
  r.count = count;
  r.inplace = inplace;
  if (inplace && !spec.in_place) {
    r.time_us = -1;
    return r;
  }
  Case c(comm, o, count, inplace, in, out, compressed);
  if (o.check && spec.moves_data()) {
    c.fill_for_check();
    if (compressed) {
      check_compressed(comm, o, *compressed, c, r);
    } else {
      c.run();
      long wrong = c.wrong();
      comm.allreduce(&wrong, 1, DataType::i64, ReduceOp::sum);
      r.wrong = wrong;
    }
  }
  c.fill();  // keep values bounded across repeated in-place operations
  if (compressed && inplace && o.op == ReduceOp::sum) c.use_op(ReduceOp::avg);
  for (int i = 0; i < o.warmup; ++i) c.run();
  const compression::CompressionStats before = compressed ? compressed->stats() : compression::CompressionStats{};
  const uint64_t traffic_before = comm.shared_memory_traffic();
  r.time_us = time_per_op_us(
      comm, [&] { c.run(); }, std::max(1, o.iters));
  r.traffic =
      double(comm.shared_memory_traffic() - traffic_before) / std::max(1, o.iters) / double(std::max<size_t>(1, bytes));
  comm.allreduce(&r.traffic, 1, DataType::f64, ReduceOp::max);
  if (compressed) {
    r.wire_bytes = double(compressed->stats().wire_bytes - before.wire_bytes) / std::max(1, o.iters);
    r.fallbacks = compressed->stats().fallbacks - before.fallbacks;
  }
  r.algbw = r.time_us > 0 ? double(bytes) / r.time_us / 1e3 : 0;
  r.busbw = r.algbw * bus_factor(spec.bus, comm.size());
  return r;
}

void print_table_header(const SweepOptions& o, Communicator& comm, const std::string& algorithm) {
  const bool barrier = is_barrier(o);
  if (barrier) {
    printf("# tandem bench barrier: %d ranks, %d iterations, %d warm-up\n", comm.size(), o.iters, o.warmup);
  } else {
    printf("# tandem bench %s: %d ranks, dtype %s, op %s, %d iterations, %d warm-up, check %s\n", o.collective.c_str(),
           comm.size(), std::string(to_string(o.dtype)).c_str(), op_name(o).c_str(), o.iters, o.warmup,
           o.check ? "on" : "off");
  }
  printf("# transports: %s; reduce kernels: %s; buffers: %s\n", comm.transport_summary().c_str(),
         std::string(reduce_isa()).c_str(), o.registered ? "registered (allocate_shared)" : "heap");
  printf("# topology: %s; all-reduce algorithm: %s\n", comm.topology().str().c_str(), algorithm.c_str());
  if (compressing(o)) {
    printf(
        "# compression: %s on the wire, f32 accumulation, predivide %d (world size); sizes and bandwidths count "
        "f32 bytes; out-of-place = copy + in-place; timed in-place loop: avg%s; errors vs a plain f32 all-reduce\n",
        std::string(compression::to_string(o.compress)).c_str(), comm.size(),
        o.op == ReduceOp::sum ? " (sum grows N-fold per repeated call)" : "");
  }
  if (barrier) {
    printf("#\n#%11s\n#%11s\n", "time", "(us)");
    return;
  }
  printf("#\n#%64s%36s\n", "out-of-place", "in-place");
  printf("#%11s %12s %6s %6s %6s %10s %8s %8s %6s %10s %8s %8s %6s %8s", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "traffic");
  if (compressing(o)) printf(" %12s %9s %9s %6s", "wire", "max err", "mean err", "fallbk");
  printf("\n#%11s %12s %6s %6s %6s %10s %8s %8s %6s %10s %8s %8s %6s %8s", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "(B/B)");
  if (compressing(o)) printf(" %12s %9s %9s %6s", "(B/op)", "", "", "");
  printf("\n");
}

std::string error_text(double e) {
  if (e < 0) return "N/A";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", e);
  return buf;
}

std::string wrong_text(long w) { return w < 0 ? "N/A" : std::to_string(w); }

// The table's time, algbw, busbw and #wrong of one placement.
std::string placement_columns(const Result& r) {
  char buf[64];
  if (!measured(r)) {
    std::snprintf(buf, sizeof buf, " %10s %8s %8s %6s", "N/A", "N/A", "N/A", "N/A");
  } else {
    std::snprintf(buf, sizeof buf, " %10.2f %8.2f %8.2f %6s", r.time_us, r.algbw, r.busbw, wrong_text(r.wrong).c_str());
  }
  return buf;
}

void print_csv(const SweepOptions& o, const Result& r) {
  printf("%s,%zu,%zu,%s,%s,%d,%d,%.3f,%.4f,%.4f,%ld", o.collective.c_str(), r.bytes, r.count,
         std::string(to_string(o.dtype)).c_str(), op_name(o).c_str(), root_of(o), r.inplace ? 1 : 0, r.time_us, r.algbw,
         r.busbw, r.wrong);
  if (compressing(o)) {
    printf(",%s,%.0f,%.6g,%.6g,%llu", std::string(compression::to_string(o.compress)).c_str(), r.wire_bytes,
           r.max_error, r.mean_error, static_cast<unsigned long long>(r.fallbacks));
  }
  printf("\n");
}

void print_json(const SweepOptions& o, int nranks, const Result& r) {
  nlohmann::json j = {{"collective", o.collective},
                      {"nranks", nranks},
                      {"bytes", r.bytes},
                      {"count", r.count},
                      {"dtype", std::string(to_string(o.dtype))},
                      {"op", op_name(o)},
                      {"root", root_of(o)},
                      {"inplace", r.inplace},
                      {"registered", o.registered},
                      {"time_us", r.time_us},
                      {"algbw_gbps", r.algbw},
                      {"busbw_gbps", r.busbw},
                      {"wrong", r.wrong < 0 ? 0 : r.wrong},
                      {"checked", r.wrong >= 0},
                      {"traffic_per_byte", r.traffic}};
  if (!o.algorithm.empty()) j["algorithm"] = o.algorithm;
  if (compressing(o)) {
    j["compress"] = std::string(compression::to_string(o.compress));
    j["wire_bytes"] = r.wire_bytes;
    j["fallbacks"] = r.fallbacks;
    if (r.max_error >= 0) {
      j["max_abs_error"] = r.max_error;
      j["mean_abs_error"] = r.mean_error;
    }
  }
  printf("%s\n", j.dump().c_str());
  fflush(stdout);
}

// One size: a table row, or a CSV or JSON row per placement measured.
void print_row(const SweepOptions& o, int nranks, const Result& oop, const Result& ip) {
  if (o.format == Format::table) {
    // In place: the collective's own traffic, without the out-of-place copy (else out of place's).
    // "-" below what %.2f shows: the timing's barrier and 8-byte all-reduce alone count a few bytes.
    const Result& own = measured(ip) ? ip : oop;
    char traffic[32] = "-";
    if (own.traffic >= 0.005) std::snprintf(traffic, sizeof traffic, "%.2f", own.traffic);
    printf("%12zu %12zu %6s %6s %6d%s%s %8s", oop.bytes, oop.count, std::string(to_string(o.dtype)).c_str(),
           op_name(o).c_str(), root_of(o), placement_columns(oop).c_str(), placement_columns(ip).c_str(), traffic);
    // Both placements reduce the same inputs to the same bits: one error and wire figure per row.
    if (compressing(o)) {
      printf(" %12.0f %9s %9s %6llu", ip.wire_bytes, error_text(ip.max_error).c_str(),
             error_text(ip.mean_error).c_str(), static_cast<unsigned long long>(oop.fallbacks + ip.fallbacks));
    }
    printf("\n");
  } else {
    for (const Result* r : {&oop, &ip}) {
      if (!measured(*r)) continue;
      if (o.format == Format::csv)
        print_csv(o, *r);
      else
        print_json(o, nranks, *r);
    }
  }
  fflush(stdout);
}

void run_gnuplot(const SweepOptions& o, const std::string& data, const std::string& body) {
  bench::run_gnuplot(o.plot, data, body);
}

// busbw against size, out-of-place and in-place (barrier: its time).
void plot(const SweepOptions& o, int nranks, const std::vector<Result>& results) {
  const std::string data = o.plot + ".dat";
  std::ostringstream title;
  title << "set title 'tandem " << o.collective << ", " << nranks << " ranks";
  if (is_barrier(o)) {
    std::ofstream(data) << nranks << ' ' << (results.empty() ? 0.0 : results[0].time_us) << '\n';
    title << "'\n";
    run_gnuplot(o, data,
                title.str() +
                    "set xlabel 'ranks'\nset ylabel 'time (us)'\nset xrange [0:" + std::to_string(2 * nranks) +
                    "]\nset boxwidth 0.5\nset style fill solid\n" + "plot DATA_FILE using 1:2 with boxes notitle\n");
    return;
  }
  {
    std::ofstream f(data);
    // Two data blocks (gnuplot "index" 0 and 1): out-of-place, then in-place.
    for (bool inplace : {false, true}) {
      for (const auto& r : results) {
        if (r.inplace == inplace && measured(r)) f << r.bytes << ' ' << r.busbw << '\n';
      }
      f << "\n\n";
    }
  }
  title << ", " << to_string(o.dtype);
  if (spec_of(o.collective).reduces) title << " " << to_string(o.op);
  if (spec_of(o.collective).rooted()) title << ", root " << o.root;
  title << "'\n";
  std::string lines = "plot DATA_FILE index 0 using 1:2 with linespoints title 'out-of-place'";
  if (spec_of(o.collective).in_place) {
    lines += ", \\\n     DATA_FILE index 1 using 1:2 with linespoints title 'in-place'";
  }
  run_gnuplot(o, data,
              "set logscale x 2\nset format x '%.0b %BB'\nset xlabel 'message size'\n"
              "set ylabel 'bus bandwidth (GB/s)'\nset key left top\n" +
                  title.str() + lines + "\n");
}

// barrier: one timed row, whatever the sizes.
void run_barrier(Communicator& comm, const SweepOptions& o, std::vector<Result>& results) {
  Result r = measure(comm, o, 0, false, nullptr, nullptr);
  results.push_back(r);
  if (comm.rank() != 0) return;
  if (o.format == Format::json) {
    print_json(o, comm.size(), r);
  } else if (o.format == Format::csv) {
    print_csv(o, r);
  } else {
    printf("%12.2f\n#\n# Avg barrier time    : %.2f us\n#\n", r.time_us, r.time_us);
  }
  fflush(stdout);
}

}  // namespace

double time_per_op_us(Communicator& comm, const std::function<void()>& op, int iters) {
  comm.barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  comm.allreduce(&us, 1, DataType::f64, ReduceOp::max);  // the slowest rank decides
  return us;
}

int run_sweep(const SweepOptions& o) {
  const Spec& spec = spec_of(o.collective);
  if (o.min_bytes > o.max_bytes) throw InvalidArgument("tandem bench: -b must not exceed -e");
  if (o.increment == 0 && o.factor <= 1.0) throw InvalidArgument("tandem bench: -f must be > 1 (or use -i)");
  if (o.iters < 1 || o.warmup < 0) throw InvalidArgument("tandem bench: -n must be >= 1 and -w >= 0");

  if (compressing(o) &&
      (spec.op != Op::allreduce || o.dtype != DataType::f32 || (o.op != ReduceOp::sum && o.op != ReduceOp::avg))) {
    throw InvalidArgument("tandem bench: --compress works on allreduce of f32 with op sum or avg");
  }
  CommOptions comm_options = comm_options_from_env();
  ring::RingOptions ring_options = ring::ring_options_from_env();
  if (!o.algorithm.empty()) ring_options.allreduce = ring::parse_allreduce_algorithm(o.algorithm);
  auto comm = ring::connect(comm_options, ring_options);
  if (spec.op == Op::group && comm->size() < 2) {
    throw InvalidArgument("tandem bench sendrecv: needs 2 or more ranks (rank r sends to r+1, receives from r-1)");
  }
  if (spec.rooted() && (o.root < 0 || o.root >= comm->size())) {
    throw InvalidArgument("tandem bench: -r " + std::to_string(o.root) + " is not a rank of this " +
                          std::to_string(comm->size()) + "-rank job");
  }
  const bool printer = comm->rank() == 0;
  const size_t esize = dtype_size(o.dtype);
  if (printer && o.format == Format::table) print_table_header(o, *comm, ring::to_string(ring_options.allreduce));
  if (printer && o.format == Format::csv) {
    printf("collective,bytes,count,dtype,op,root,inplace,time_us,algbw_gbps,busbw_gbps,wrong%s\n",
           compressing(o) ? ",compress,wire_bytes,max_abs_error,mean_abs_error,fallbacks" : "");
  }

  std::vector<Result> results;
  if (!spec.moves_data()) {
    run_barrier(*comm, o, results);
    if (printer && !o.plot.empty()) plot(o, comm->size(), results);
    return 0;
  }
  long total_wrong = 0;
  double busbw_sum = 0;
  int rows = 0;
  // Sizes are whole buffers: whole elements, and whole blocks per rank where the buffer holds one per rank.
  Buffers buffers(*comm, o.max_bytes + esize, o.registered);
  std::optional<compression::CompressedAllreduce> compressed;
  if (compressing(o)) compressed.emplace(*comm, compression::CompressionOptions{o.compress});
  compression::CompressedAllreduce* codec = compressed ? &*compressed : nullptr;
  for (size_t bytes : sizes_of(o, esize * spec.size_blocks(comm->size()))) {
    Result oop = measure(*comm, o, bytes, false, buffers.in, buffers.out, codec);
    Result ip = measure(*comm, o, bytes, true, buffers.in, buffers.out, codec);
    for (const Result& r : {oop, ip}) {
      if (!measured(r)) continue;
      total_wrong += std::max(0L, r.wrong);
      busbw_sum += r.busbw;
      ++rows;
      results.push_back(r);
    }
    if (printer) print_row(o, comm->size(), oop, ip);
  }
  if (printer && o.format == Format::table) {
    printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.4f GB/s\n#\n", rows ? busbw_sum / rows : 0.0);
  }
  if (printer && !o.plot.empty()) plot(o, comm->size(), results);
  return total_wrong ? 1 : 0;
}

}  // namespace tandem::bench
