// ring::algorithms(): picks an algorithm per call. All-reduce: recursive
// doubling up to small_message_bytes (latency-bound), the pipelined ring
// above (bandwidth-bound), unless one is forced.
#include <string>

#include "collectives.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"

namespace tandem::ring {
namespace {

class RingAlgorithms final : public Algorithms {
 public:
  explicit RingAlgorithms(const RingOptions& o) : options_(o) {}

  void allreduce(Channel& ch, const AllreduceArgs& args) override {
    const size_t bytes = args.count * dtype_size(args.dtype);
    const bool small = options_.allreduce == AllreduceAlgorithm::recursive_doubling ||
                       (options_.allreduce == AllreduceAlgorithm::automatic && bytes <= options_.small_message_bytes);
    if (small) {
      recursive_doubling_allreduce(ch, args);
    } else {
      ring_allreduce(ch, args, options_);
    }
  }
  void reduce_scatter(Channel& ch, const ReduceScatterArgs& args) override { ring_reduce_scatter(ch, args, options_); }
  void allgather(Channel& ch, const AllgatherArgs& args) override { ring_allgather(ch, args, options_); }
  void broadcast(Channel& ch, const BroadcastArgs& args) override { pipelined_broadcast(ch, args, options_); }
  void barrier(Channel& ch) override { ring::barrier(ch); }

 private:
  RingOptions options_;
};

}  // namespace

AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name) {
  if (name == "auto") return AllreduceAlgorithm::automatic;
  if (name == "ring") return AllreduceAlgorithm::ring;
  if (name == "recursive_doubling" || name == "rd") return AllreduceAlgorithm::recursive_doubling;
  throw InvalidArgument("unknown all-reduce algorithm '" + name +
                        "' (TANDEM_ALGO); use auto, ring or recursive_doubling");
}

std::shared_ptr<Algorithms> algorithms(const RingOptions& options) {
  if (options.segment_bytes < 4096 || options.segments_in_flight < 1 || options.segments_in_flight > 64) {
    throw InvalidArgument("RingOptions: segment_bytes must be >= 4096 and segments_in_flight in 1..64 (got " +
                          std::to_string(options.segment_bytes) + ", " + std::to_string(options.segments_in_flight) +
                          ")");
  }
  return std::make_shared<RingAlgorithms>(options);
}

RingOptions ring_options(const CommOptions& options) {
  RingOptions r;
  r.segment_bytes = options.segment_bytes;
  r.segments_in_flight = options.segments_in_flight;
  r.small_message_bytes = options.small_message_bytes;
  r.allreduce = parse_allreduce_algorithm(options.algorithm);
  return r;
}

std::unique_ptr<Communicator> connect(const CommOptions& options) {
  return Communicator::create(options, algorithms(ring_options(options)));
}

std::unique_ptr<Communicator> connect_from_env() { return connect(options_from_env()); }

}  // namespace tandem::ring
