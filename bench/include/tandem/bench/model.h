#pragma once
// The scale model: an alpha-beta-gamma cost model of all-reduce.
//
// Terms. A *link* is one kind of path between two ranks (shared memory on a
// host, TCP between hosts, ...). alpha is its per-message latency in seconds,
// beta its seconds per byte for one rank sending while receiving (full
// duplex), at the size of the message each rank sends (a ring step N/p, a
// recursive-doubling exchange N). gamma is seconds per byte to reduce one f32 stream into another on
// one core. N is the message in bytes; H hosts, L ranks per host, p = H * L.
// A link is *cpu-bound* when its beta is the cores' cost of moving bytes
// (copies, the TCP stack) rather than a wire's rate: ranks then slow each
// other down once a host runs more of them than it has cores.
// Oversubscription: with rho = ranks sharing a host's cores / cores > 1, a
// rank often waits for one that is not running, and the scheduler hands the
// core over; every synchronisation step (a ring step, a recursive-doubling
// round, a shared-memory rendezvous) then costs step(rho) - step(1) more.
// step(rho) is measured, per path, by timing a tiny allgather (one message
// each way per step, no arithmetic) with rho * cores processes; it is 0 for
// rho <= 1 and grows in proportion to rho - 1 beyond the largest measured.
//
// Algorithms (every rank ends with the sum):
//  ring               2(p-1) steps of N/p, pipelined in segments; every step
//                     limited by the slowest edge, inter-host once H > 1
//                     (host-major order). Reduction overlaps transfer unless
//                     the link is cpu-bound (the same cores do both).
//  recursive doubling ceil(log2 p) exchanges of N (+2 for a non-power of two).
//  hierarchical       intra-host reduce-scatter, H-rank rings of N/L (one per
//                     local rank, all L sharing the host's NIC), intra-host
//                     allgather.
//  shared memory      tandem's one-host path: traffic * N bytes moved per
//                     rank through memory at the calibrated beta of that size,
//                     plus a synchronisation per call.
//  parameter server   p workers push N and pull N; S = H servers on hosts of
//                     their own sum p*N/S each.
#include <map>
#include <string>
#include <vector>

namespace tandem::bench {

// Seconds per synchronisation step by ranks per core (the calibrated machine's).
using StepTable = std::map<double, double>;
// What a step costs beyond the unshared one at rho ranks per core: 0 for
// rho <= 1 (or no entry above 1); linear in rho between entries; beyond the
// largest, in proportion to rho - 1.
double oversubscribed_step(const StepTable& step, double rho);

struct Link {
  double alpha = 0;  // s per message
  double beta = 0;   // s per byte at large sizes (the bandwidth)
  bool cpu_bound = false;
  StepTable step;  // ranks per core -> s per step of the tiny allgather over this link
  // Cores one rank keeps busy while it moves bytes over the link (measured on
  // cpu-bound links; 0 = a whole core): L ranks on C cores stretch beta by
  // max(1, L * cpu_share / C).
  double cpu_share = 0;
  // Bytes one rank sends in a message -> s per byte at that size (interpolated
  // in log size, flat beyond the ends). Mid-size messages can move faster than
  // the large-size beta (TCP's buffers and a rate limiter's burst absorb them);
  // empty = beta at every size (calibrations from before it was measured).
  std::map<double, double> beta_by_size;
  // Ranks per core above 1 -> how much slower a rank moves a byte than with
  // a core each (cpu-bound links, measured with --step-only); empty = the
  // estimate from cpu_share.
  StepTable stretch;
  double beta_at(double message_bytes) const;
};

// The one-host path at each calibrated size (interpolated in log size, held
// flat beyond the ends). beta is per size because a working set that fits the
// caches moves several times faster than one that streams through DRAM.
struct SharedMemoryCost {
  double alpha = 0;                  // s per call (synchronisation)
  std::map<double, double> beta;     // bytes -> s per byte of one rank's memory traffic
  std::map<double, double> traffic;  // bytes -> memory traffic per byte reduced, one rank
  StepTable step;                    // ranks per core -> s per rendezvous of all ranks (tiny allgather)
  StepTable copy;                    // ranks per core -> s per all-reduce of kCopyBytes (memory traffic)
  double beta_at(double bytes) const;
  double traffic_at(double bytes) const;
};

// The shared-memory all-reduce timed for `copy`: large enough that its bytes,
// not its rendezvous, take the time, small enough to stay in the caches. The
// all-reduce itself, not an allgather: this machine has run the 2-rank
// all-reduce 3x slower for a while with the allgather unchanged, and a
// stretch taken from the allgather then multiplied the slow all-reduce.
constexpr double kCopyBytes = 1 << 20;
// The allgather timed for a cpu-bound link's stretch: the large messages that
// dominate its all-reduce time.
constexpr double kLinkCopyBytes = 16 << 20;
// How much slower shared memory moves a byte at rho ranks per core than within
// the cores: (copy(rho) - 2 step(rho)) / (copy(1) - 2 step(1)), from (1, 1)
// linearly between entries, in proportion to rho - 1 beyond the largest; rho
// itself (the cores shared evenly) when nothing past the cores was measured.
double copy_stretch(const SharedMemoryCost& shm, double rho);

struct Calibration {
  int cores = 2;                      // cores per host
  double gamma = 0;                   // s per byte reduced (f32 sum, one core)
  SharedMemoryCost shm;               // one host
  std::map<std::string, Link> links;  // inter-host links by name
  // Each oversubscribed --step-only figure from every launch that measured it
  // ("shared_memory step 2" -> seconds...): its table holds their median, as
  // one launch can settle into a faster or slower schedule than the next.
  std::map<std::string, std::vector<double>> samples;
  std::string describe() const;
};

enum class Algorithm { ring, recursive_doubling, hierarchical, shared_memory, parameter_server };
const char* to_string(Algorithm a);

struct Topology {
  int hosts = 1;
  int ranks_per_host = 1;
  int ranks() const { return hosts * ranks_per_host; }
  // Ranks that share one host's cores (namespaces on one machine share them all).
  int ranks_on_cores = 0;  // 0 = ranks_per_host
};

// Predicted seconds for one all-reduce of `bytes`; inter is the inter-host link
// (ignored when hosts == 1). Throws InvalidArgument for an algorithm that does
// not apply (e.g. hierarchical on one host).
double predict(const Calibration& c, const Link& inter, const Topology& t, Algorithm a, double bytes);
bool applies(Algorithm a, const Topology& t);
Algorithm parse_algorithm(const std::string& name);  // as to_string() writes it
// The algorithm tandem's automatic choice would run (what `validate` compares
// against unless a sweep row names the algorithm it forced).
Algorithm tandem_choice(const Topology& t, double bytes, double small_message_bytes);
// Fastest applicable algorithm (parameter server excluded: it needs extra hosts).
Algorithm fastest(const Calibration& c, const Link& inter, const Topology& t, double bytes);
// nccl-tests bus bandwidth of an all-reduce: bytes / time * 2(p-1)/p, GB/s.
double busbw_gbps(const Topology& t, double bytes, double seconds);

// Least-squares fit of time = a + b * bytes (a, b >= 0).
struct LineFit {
  double a = 0, b = 0;
};
LineFit fit_line(const std::vector<double>& bytes, const std::vector<double>& seconds);
// time = a + b * bytes for a link: b the median slope from the smallest size to
// each size >= `large` (bandwidth), a what the smallest size leaves (latency).
// Robust to a rate limiter's burst, which lets small messages through at once.
LineFit fit_bandwidth(const std::vector<double>& bytes, const std::vector<double>& seconds, double large);

Calibration load_calibration(const std::string& path);  // throws with the path and the problem
void save_calibration(const Calibration& c, const std::string& path);
const Link& link_named(const Calibration& c, const std::string& name);  // throws naming the known links

// `tandem model ...` entry points (cli/ parses flags).
struct CalibrateOptions {
  std::string output = "tandem-model.json";
  std::string link;        // empty = shared memory (one host); else the inter-host link's name
  bool cpu_bound = false;  // the link's cost is the cores' (veth without a rate limit), not a wire's
  std::vector<double> sizes;
  int iters = 10;
  // Only the synchronisation step, at any rank count (run with more ranks than
  // cores: the oversubscription term); the path's 2-rank calibration must exist.
  bool step_only = false;
};
int run_calibrate(const CalibrateOptions& o);  // one rank of a 2-rank job; rank 0 writes

struct PredictOptions {
  std::string calibration;
  std::string link;  // inter-host link name, or "GBPS:ALPHA_US" for a hypothetical one
  std::vector<Topology> topologies;
  std::vector<double> sizes;
  std::string format = "table";
  std::string plot;
  int cores = 0;  // cores per host assumed; 0 = the calibration's
};
int run_predict(const PredictOptions& o);

struct ValidateCase {
  Topology topology;
  std::string link;  // empty for one host
  std::string file;  // `tandem bench allreduce --format json` lines
};
struct ValidateOptions {
  std::string calibration;
  std::vector<ValidateCase> cases;
  double tolerance = 0.25;
  double small_message_bytes = 64 << 10;
  bool one_machine = true;  // every case's ranks share this machine's cores (namespaces)
  std::string format = "table";
};
int run_validate(const ValidateOptions& o);
ValidateCase parse_case(const std::string& text);       // "HxL[:LINK]=FILE"
Link parse_hypothetical_link(const std::string& text);  // "GBPS:ALPHA_US"

}  // namespace tandem::bench
