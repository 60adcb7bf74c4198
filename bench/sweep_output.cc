#include "sweep_output.h"

#include <nlohmann/json.hpp>

#include "sweep_case.h"
#include "tandem/tandem.h"

namespace tandem::bench {

std::string op_name(const SweepOptions& o) {
  return spec_of(o.collective).reduces ? std::string(to_string(o.op)) : "none";
}
int root_of(const SweepOptions& o) { return spec_of(o.collective).rooted() ? o.root : -1; }
bool compressing(const SweepOptions& o) { return o.compress != compression::Codec::none; }

namespace {

bool is_barrier(const SweepOptions& o) { return !spec_of(o.collective).moves_data(); }

// What the time column is, for the header: which rank reduction, which clock, how the loop ran.
std::string time_meaning(const SweepOptions& o) {
  static const char* const kRankTime[] = {"rank 0's mean (-a 0)", "the mean over ranks (-a 1)",
                                          "the fastest rank's mean (-a 2)", "the slowest rank's mean (-a 3)"};
  std::string s = std::string("# time: ") + kRankTime[int(o.rank_time)] + " per operation, " +
                  (o.cpu_time ? "CPU time of the calling thread (-C 1)" : "wall time");
  if (o.agg_iters > 1) {
    s += ", " + std::to_string(o.agg_iters) +
         (o.blocking ? " operations per iteration, each waited (-z 1)"
                     : " operations started per iteration, then all waited");
  }
  return s + "; JSON adds the slowest rank's and the per-iteration p50, p99, min and max\n";
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

void print_csv(FILE* out, const SweepOptions& o, const Result& r) {
  fprintf(out, "%s,%zu,%zu,%s,%s,%d,%d,%.3f,%.4f,%.4f,%ld,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%d", o.collective.c_str(),
          r.bytes, r.count, std::string(to_string(o.dtype)).c_str(), op_name(o).c_str(), root_of(o), r.inplace ? 1 : 0,
          r.time_us, r.algbw, r.busbw, r.wrong, to_string(o.rank_time), r.slowest_us, r.iterations.p50,
          r.iterations.p99, r.iterations.min, r.iterations.max, r.cycle);
  if (o.timestamps) fprintf(out, ",%s", r.timestamp.c_str());
  if (compressing(o)) {
    fprintf(out, ",%s,%.0f,%.6g,%.6g,%llu", std::string(compression::to_string(o.compress)).c_str(), r.wire_bytes,
            r.max_error, r.mean_error, static_cast<unsigned long long>(r.fallbacks));
  }
  fprintf(out, "\n");
}

void add_compression(const SweepOptions& o, const Result& r, nlohmann::json& j) {
  j["compress"] = std::string(compression::to_string(o.compress));
  j["wire_bytes"] = r.wire_bytes;
  j["fallbacks"] = r.fallbacks;
  if (r.max_error >= 0) {
    j["max_abs_error"] = r.max_error;
    j["mean_abs_error"] = r.mean_error;
  }
}

void print_json(FILE* out, const SweepOptions& o, int nranks, const Result& r) {
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
                      {"rank_time", to_string(o.rank_time)},
                      {"clock", o.cpu_time ? "cpu" : "wall"},
                      {"time_slowest_us", r.slowest_us},
                      {"time_p50_us", r.iterations.p50},
                      {"time_p99_us", r.iterations.p99},
                      {"time_min_us", r.iterations.min},
                      {"time_max_us", r.iterations.max},
                      {"iters", o.iters},
                      {"agg_iters", o.agg_iters},
                      {"cycle", r.cycle},
                      {"algbw_gbps", r.algbw},
                      {"busbw_gbps", r.busbw},
                      {"wrong", r.wrong < 0 ? 0 : r.wrong},
                      {"checked", r.wrong >= 0},
                      {"traffic_per_byte", r.traffic}};
  if (!o.algorithm.empty()) j["algorithm"] = o.algorithm;
  if (o.timestamps) j["timestamp"] = r.timestamp;
  if (compressing(o)) add_compression(o, r, j);
  fprintf(out, "%s\n", j.dump().c_str());
}

void print_machine_row(FILE* out, Format format, const SweepOptions& o, int nranks, const Result& r) {
  if (format == Format::csv)
    print_csv(out, o, r);
  else
    print_json(out, o, nranks, r);
  fflush(out);
}

void print_table_row(const SweepOptions& o, const Result& oop, const Result& ip) {
  // In place: the collective's own traffic, without the out-of-place copy (else out of place's).
  // "-" below what %.2f shows: the timing's barrier and 8-byte all-reduce alone count a few bytes.
  const Result& own = measured(ip) ? ip : oop;
  char traffic[32] = "-";
  if (own.traffic >= 0.005) std::snprintf(traffic, sizeof traffic, "%.2f", own.traffic);
  printf("%12zu %12zu %6s %6s %6d%s%s %8s", oop.bytes, oop.count, std::string(to_string(o.dtype)).c_str(),
         op_name(o).c_str(), root_of(o), placement_columns(oop).c_str(), placement_columns(ip).c_str(), traffic);
  // Both placements reduce the same inputs to the same bits: one error and wire figure per row.
  if (compressing(o)) {
    printf(" %12.0f %9s %9s %6llu", ip.wire_bytes, error_text(ip.max_error).c_str(), error_text(ip.mean_error).c_str(),
           static_cast<unsigned long long>(oop.fallbacks + ip.fallbacks));
  }
  if (o.timestamps) printf(" %20s", oop.timestamp.c_str());
  printf("\n");
}

}  // namespace

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
  printf("%s", time_meaning(o).c_str());
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
  if (o.timestamps) printf(" %20s", "timestamp");
  printf("\n#%11s %12s %6s %6s %6s %10s %8s %8s %6s %10s %8s %8s %6s %8s", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "(B/B)");
  if (compressing(o)) printf(" %12s %9s %9s %6s", "(B/op)", "", "", "");
  if (o.timestamps) printf(" %20s", "(UTC)");
  printf("\n");
}

void print_csv_header(FILE* out, const SweepOptions& o) {
  fprintf(out,
          "collective,bytes,count,dtype,op,root,inplace,time_us,algbw_gbps,busbw_gbps,wrong,rank_time,time_slowest_us,"
          "time_p50_us,time_p99_us,time_min_us,time_max_us,cycle%s%s\n",
          o.timestamps ? ",timestamp" : "",
          compressing(o) ? ",compress,wire_bytes,max_abs_error,mean_abs_error,fallbacks" : "");
  fflush(out);
}

void print_row(const SweepOptions& o, int nranks, const Result& oop, const Result& ip, const Sinks& sinks) {
  for (const Result* r : {&oop, &ip}) {
    if (!measured(*r)) continue;
    if (o.format != Format::table) print_machine_row(stdout, o.format, o, nranks, *r);
    if (sinks.file) print_machine_row(sinks.file, sinks.file_format, o, nranks, *r);
  }
  if (o.format == Format::table) print_table_row(o, oop, ip);
  fflush(stdout);
}

void print_barrier(const SweepOptions& o, int nranks, const Result& r, const Sinks& sinks) {
  if (o.format == Format::table) {
    printf("%12.2f\n#\n# Avg barrier time    : %.2f us\n#\n", r.time_us, r.time_us);
  } else {
    print_machine_row(stdout, o.format, o, nranks, r);
  }
  if (sinks.file) print_machine_row(sinks.file, sinks.file_format, o, nranks, r);
  fflush(stdout);
}

}  // namespace tandem::bench
