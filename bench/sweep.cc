// nccl-tests-style sweep: for each size, an optional checked run, warm-up,
// then a timed loop of back-to-back collectives after a barrier. Each rank
// times every iteration; the time reported is each rank's mean per operation
// reduced across ranks as -a says (nccl-tests' default: the mean over ranks),
// and the slowest rank's mean goes with it (a collective is only done when
// every rank is). busbw = algbw * factor, with nccl-tests' factors.
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
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sweep_case.h"
#include "sweep_output.h"
#include "tandem/bench/buffers.h"
#include "tandem/bench/check.h"
#include "tandem/bench/plot.h"
#include "tandem/tandem.h"

namespace tandem::bench {
namespace {

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

// -T: when one placement of one size (check, warm-up and timed loop) must be done.
struct SizeDeadline {
  std::optional<Deadline> at;
  int seconds = 0;
  std::string what;

  SizeDeadline(const SweepOptions& o, size_t bytes, bool inplace) : seconds(o.timeout_s) {
    if (!seconds) return;
    at = Clock::now() + std::chrono::seconds(seconds);
    what = o.collective + " of " + std::to_string(bytes) + " bytes " + (inplace ? "in place" : "out of place");
  }
  void check() const {
    if (at && Clock::now() > *at) {
      throw Timeout("tandem bench: " + what + " took longer than -T " + std::to_string(seconds) +
                    " s (nccl-tests' per-test timeout); lower -n, -m or -e, or raise -T");
    }
  }
};

// Nanoseconds on the wall clock, or of this thread's CPU time (-C 1).
int64_t now_ns(bool cpu) {
  if (!cpu) return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// This rank's timed loop: µs per operation over the loop and in each iteration.
struct RankTimes {
  double mean_us = 0;
  std::vector<double> per_iteration_us;
};

// -n iterations of -m operations each: started together and then all waited,
// or (-m 1, -z 1) each run to completion before the next.
// Iterations shorter than kStampNs are stamped in groups (`group`, the same
// on every rank) that last about that long: a clock read, 20-30 ns, would
// otherwise be part of each one's time (5 % of a 4 KiB gather), where
// nccl-tests and MPI's benchmarks time the whole loop.
constexpr double kStampNs = 20000;
constexpr int kMaxStampGroup = 256;

// Stamps a group of iterations per entry of per_iteration_us (its per-operation mean).
RankTimes timed_loop(Communicator& comm, const SweepOptions& o, Case& c, const SizeDeadline& deadline, int group) {
  const int agg = std::max(1, o.agg_iters);
  const bool aggregated = agg > 1 && !o.blocking;
  RankTimes t;
  t.per_iteration_us.reserve(size_t((o.iters + group - 1) / group));
  std::vector<Request> pending;
  comm.barrier();
  const int64_t t0 = now_ns(o.cpu_time);
  int64_t last = t0;
  for (int i = 0; i < o.iters; ++i) {
    if (aggregated) {
      for (int k = 0; k < agg; ++k) c.start(pending);
      for (Request& r : pending) r.wait();
      pending.clear();
    } else {
      for (int k = 0; k < agg; ++k) c.run();
    }
    const int in_group = (i + 1) % group == 0 ? group : i + 1 == o.iters ? (i + 1) % group : 0;
    if (in_group == 0) continue;
    const int64_t now = now_ns(o.cpu_time);
    t.per_iteration_us.push_back(double(now - last) / 1e3 / (double(agg) * in_group));
    last = now;
    deadline.check();
  }
  t.mean_us = double(last - t0) / 1e3 / (double(o.iters) * agg);
  return t;
}

// The group for timed_loop, from the slowest rank's fastest warm-up
// iteration (0 ns: none).
int stamp_group(Communicator& comm, double warm_ns_per_iteration) {
  comm.allreduce(&warm_ns_per_iteration, 1, DataType::f64, ReduceOp::max);
  if (warm_ns_per_iteration <= 0) return 1;
  return int(std::clamp(std::ceil(kStampNs / warm_ns_per_iteration), 1.0, double(kMaxStampGroup)));
}

double pick(RankTime how, const std::vector<double>& per_rank) {
  switch (how) {
    case RankTime::rank0: return per_rank[0];
    case RankTime::avg: {
      double sum = 0;
      for (double v : per_rank) sum += v;
      return sum / double(per_rank.size());
    }
    case RankTime::min: return *std::min_element(per_rank.begin(), per_rank.end());
    case RankTime::max: break;
  }
  return *std::max_element(per_rank.begin(), per_rank.end());
}

// Nearest-rank percentiles of the iterations' times (p99 of fewer than 100 iterations: the slowest).
IterationStats iteration_stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto at = [&](double p) { return v[std::min(v.size() - 1, size_t(std::ceil(p * double(v.size()))) - 1)]; };
  return {at(0.5), at(0.99), v.front(), v.back()};
}

// Every rank's mean reduced as -a says, the slowest rank's mean, and each
// iteration's time reduced across ranks likewise before its statistics.
void reduce_across_ranks(Communicator& comm, const SweepOptions& o, RankTimes& t, Result& r) {
  std::vector<double> means(size_t(comm.size()));
  comm.allgather(&t.mean_us, means.data(), 1, DataType::f64);
  r.time_us = pick(o.rank_time, means);
  r.slowest_us = *std::max_element(means.begin(), means.end());
  std::vector<double>& v = t.per_iteration_us;
  switch (o.rank_time) {
    case RankTime::rank0: comm.broadcast(v.data(), v.size(), DataType::f64, 0); break;
    case RankTime::avg:
      comm.allreduce(v.data(), v.size(), DataType::f64, ReduceOp::sum);
      for (double& x : v) x /= comm.size();
      break;
    case RankTime::min: comm.allreduce(v.data(), v.size(), DataType::f64, ReduceOp::min); break;
    case RankTime::max: comm.allreduce(v.data(), v.size(), DataType::f64, ReduceOp::max); break;
  }
  r.iterations = iteration_stats(v);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
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
  const SizeDeadline deadline(o, bytes, inplace);
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
  // The fastest warm-up iteration sizes the stamp groups: the first calls
  // (wire-up, first touch, the path's trials) run far slower than the rest.
  double fastest_warm_ns = 0;
  for (int i = 0; i < o.warmup; ++i) {
    const int64_t start = now_ns(o.cpu_time);
    c.run();
    const double ns = double(now_ns(o.cpu_time) - start);
    fastest_warm_ns = i == 0 ? ns : std::min(fastest_warm_ns, ns);
    deadline.check();
  }
  // A timed iteration runs -m operations; a warm-up iteration one.
  const int group = stamp_group(comm, fastest_warm_ns * std::max(1, o.agg_iters));
  const compression::CompressionStats before = compressed ? compressed->stats() : compression::CompressionStats{};
  const uint64_t traffic_before = comm.shared_memory_traffic();
  RankTimes times = timed_loop(comm, o, c, deadline, group);
  const double ops = double(o.iters) * std::max(1, o.agg_iters);
  r.traffic = double(comm.shared_memory_traffic() - traffic_before) / ops / double(std::max<size_t>(1, bytes));
  comm.allreduce(&r.traffic, 1, DataType::f64, ReduceOp::max);
  reduce_across_ranks(comm, o, times, r);
  if (compressed) {
    r.wire_bytes = double(compressed->stats().wire_bytes - before.wire_bytes) / ops;
    r.fallbacks = compressed->stats().fallbacks - before.fallbacks;
  }
  r.algbw = r.time_us > 0 ? double(bytes) / r.time_us / 1e3 : 0;
  r.busbw = r.algbw * bus_factor(spec.bus, comm.size());
  if (o.timestamps) r.timestamp = utc_now();
  return r;
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

// What one sweep shares across its tables (-d/-o/-r all): the communicator,
// the buffers, the codec and where rows go.
struct Sweep {
  Communicator& comm;
  Buffers& buffers;
  compression::CompressedAllreduce* codec;
  Sinks sinks;
  std::string algorithm;
  bool printer() const { return comm.rank() == 0; }
};

// barrier: one timed row per cycle, whatever the sizes.
void run_barrier(Sweep& s, const SweepOptions& o) {
  std::vector<Result> results;
  for (int cycle = 1; o.cycles == 0 || cycle <= o.cycles; ++cycle) {
    Result r = measure(s.comm, o, 0, false, nullptr, nullptr);
    r.cycle = cycle;
    results.push_back(r);
    if (s.printer()) print_barrier(o, s.comm.size(), r, s.sinks);
  }
  if (s.printer() && !o.plot.empty()) plot(o, s.comm.size(), results);
}

// One type, op and root: a table (its header, a row per size, each cycle, and the closing lines); the wrong elements.
long run_table(Sweep& s, const SweepOptions& o) {
  Communicator& comm = s.comm;
  if (s.printer() && o.format == Format::table) print_table_header(o, comm, s.algorithm);
  if (is_barrier(o)) {
    run_barrier(s, o);
    return 0;
  }
  const Spec& spec = spec_of(o.collective);
  long total_wrong = 0;
  double busbw_sum = 0;
  int rows = 0;
  std::vector<Result> results;
  const auto sizes = sizes_of(o, dtype_size(o.dtype) * spec.size_blocks(comm.size()));
  for (int cycle = 1; o.cycles == 0 || cycle <= o.cycles; ++cycle) {
    if (s.printer() && o.format == Format::table && o.cycles != 1) {
      printf("# cycle %d%s\n", cycle, o.cycles ? (" of " + std::to_string(o.cycles)).c_str() : "");
    }
    for (size_t bytes : sizes) {
      Result oop = measure(comm, o, bytes, false, s.buffers.in, s.buffers.out, s.codec);
      Result ip = measure(comm, o, bytes, true, s.buffers.in, s.buffers.out, s.codec);
      oop.cycle = ip.cycle = cycle;
      for (const Result& r : {oop, ip}) {
        if (!measured(r)) continue;
        total_wrong += std::max(0L, r.wrong);
        busbw_sum += r.busbw;
        ++rows;
        results.push_back(r);
      }
      if (s.printer()) print_row(o, comm.size(), oop, ip, s.sinks);
    }
  }
  if (s.printer() && o.format == Format::table) {
    printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.4f GB/s\n#\n", rows ? busbw_sum / rows : 0.0);
  }
  if (s.printer() && !o.plot.empty()) plot(o, comm.size(), results);
  return total_wrong;
}

void validate(const SweepOptions& o) {
  const Spec& spec = spec_of(o.collective);
  if (o.min_bytes > o.max_bytes) throw InvalidArgument("tandem bench: -b must not exceed -e");
  if (o.increment == 0 && o.factor <= 1.0) throw InvalidArgument("tandem bench: -f must be > 1 (or use -i)");
  if (o.iters < 1 || o.warmup < 0) throw InvalidArgument("tandem bench: -n must be >= 1 and -w >= 0");
  if (o.agg_iters < 1) throw InvalidArgument("tandem bench: -m must be >= 1 (operations per iteration)");
  if (o.cycles < 0 || o.timeout_s < 0) throw InvalidArgument("tandem bench: -N and -T must be >= 0");
  const bool many = o.dtypes.size() > 1 || o.ops.size() > 1 || o.every_root;
  if (many && !o.plot.empty()) {
    throw InvalidArgument("tandem bench: --plot draws one table; drop -d all, -o all or -r all to plot");
  }
  if (!compressing(o)) return;
  bool f32_sum_or_avg = spec.op == Op::allreduce;
  for (DataType t : o.dtypes) f32_sum_or_avg &= t == DataType::f32;
  for (ReduceOp op : o.ops) f32_sum_or_avg &= op == ReduceOp::sum || op == ReduceOp::avg;
  if (!f32_sum_or_avg) throw InvalidArgument("tandem bench: --compress works on allreduce of f32 with op sum or avg");
}

// Ranks the test needs, known once connected.
void check_ranks(const SweepOptions& o, const Spec& spec, int n) {
  if (spec.peers == Peers::ring && n < 2) {
    throw InvalidArgument("tandem bench sendrecv: needs 2 or more ranks (rank r sends to r+1, receives from r-1)");
  }
  if (spec.peers == Peers::hypercube && (n & (n - 1)) != 0) {
    throw InvalidArgument(
        "tandem bench hypercube: needs a power-of-two number of ranks (step s pairs rank r with r ^ 2^s); this job "
        "has " +
        std::to_string(n));
  }
  if (spec.rooted() && !o.every_root && (o.root < 0 || o.root >= n)) {
    throw InvalidArgument("tandem bench: -r " + std::to_string(o.root) + " is not a rank of this " + std::to_string(n) +
                          "-rank job");
  }
}

// The -J file, rank 0's alone: CSV by its .csv suffix, else JSON lines.
Sinks open_sinks(const SweepOptions& o, bool printer) {
  Sinks sinks;
  if (!printer || o.output_file.empty()) return sinks;
  sinks.file = std::fopen(o.output_file.c_str(), "w");
  if (!sinks.file) {
    throw InvalidArgument("tandem bench: -J: cannot write '" + o.output_file + "': " + std::strerror(errno));
  }
  std::string name = o.output_file;
  for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  sinks.file_format = name.ends_with(".csv") ? Format::csv : Format::json;
  if (sinks.file_format == Format::csv) print_csv_header(sinks.file, o);
  return sinks;
}

}  // namespace

const char* to_string(RankTime t) {
  static const char* const kNames[] = {"rank0", "avg", "min", "max"};
  return kNames[int(t)];
}

double time_per_op_us(Communicator& comm, const std::function<void()>& op, int iters) {
  comm.barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  comm.allreduce(&us, 1, DataType::f64, ReduceOp::max);  // the slowest rank decides
  return us;
}

int run_sweep(const SweepOptions& options) {
  SweepOptions o = options;
  o.collective = canonical_collective(o.collective);
  if (o.dtypes.empty()) o.dtypes = {o.dtype};
  if (o.ops.empty()) o.ops = {o.op};
  validate(o);
  const Spec& spec = spec_of(o.collective);
  if (!spec.reduces) o.ops.resize(1);  // the op column says "none": one table
  if (!spec.moves_data()) o.dtypes.resize(1);

  CommOptions comm_options = comm_options_from_env();
  ring::RingOptions ring_options = ring::ring_options_from_env();
  if (!o.algorithm.empty()) ring_options.allreduce = ring::parse_allreduce_algorithm(o.algorithm);
  auto comm = ring::connect(comm_options, ring_options);
  check_ranks(o, spec, comm->size());
  std::vector<int> roots{o.root};
  if (spec.rooted() && o.every_root) {
    roots.clear();
    for (int r = 0; r < comm->size(); ++r) roots.push_back(r);
  }
  const bool printer = comm->rank() == 0;
  if (printer && o.format == Format::csv) print_csv_header(stdout, o);
  size_t widest = 1;
  for (DataType t : o.dtypes) widest = std::max(widest, dtype_size(t));
  // Sizes are whole buffers: whole elements, and whole blocks per rank where the buffer holds one per rank.
  Buffers buffers(*comm, o.max_bytes + widest, o.registered);
  std::optional<compression::CompressedAllreduce> compressed;
  if (compressing(o)) compressed.emplace(*comm, compression::CompressionOptions{o.compress});
  Sweep sweep{*comm, buffers, compressed ? &*compressed : nullptr, open_sinks(o, printer),
              ring::to_string(ring_options.allreduce)};
  long total_wrong = 0;
  for (DataType dtype : o.dtypes) {
    for (ReduceOp op : o.ops) {
      for (int root : roots) {
        SweepOptions table = o;
        table.dtype = dtype, table.op = op, table.root = root;
        total_wrong += run_table(sweep, table);
      }
    }
  }
  if (sweep.sinks.file) std::fclose(sweep.sinks.file);
  return total_wrong ? 1 : 0;
}

}  // namespace tandem::bench
