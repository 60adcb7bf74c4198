// One rank of partition_test (run in a network namespace; bootstrap from the
// environment). Every 20 ms a step all-reduces each member's first rank + 1
// and checks the sum over the members. At step `cut_step` rank `cut_rank`
// takes its host's link down (the partition). On a failure a rank shrinks
// and goes on from the agreed step when its side holds a majority; a side
// that cannot shrink stops. Prints
//   went on: members <m,...> of <n> at step <s>
//   done: <steps> steps, last sum <v> right
//   stopped: <why>            (exit 3)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tandem/bootstrap.h"
#include "tandem/ring/ring.h"

using tandem::DataType;
using tandem::ReduceOp;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: partition_rank STEPS CUT_RANK CUT_STEP INTERFACE\n");
    return 2;
  }
  const int steps = std::atoi(argv[1]), cut_rank = std::atoi(argv[2]), cut_step = std::atoi(argv[3]);
  const std::string cut = std::string("ip link set ") + argv[4] + " down";
  std::unique_ptr<tandem::Communicator> comm;
  try {
    comm = tandem::ring::connect_from_env();
  } catch (const std::exception& e) {
    std::printf("stopped: %s\n", e.what());
    return 3;
  }
  const int first_size = comm->size();
  std::vector<int> members;  // each rank's first rank
  for (int r = 0; r < first_size; ++r) members.push_back(r);
  const int me = comm->rank();
  double sum = 0;
  for (int step = 0; step < steps;) {
    if (me == cut_rank && step == cut_step && std::system(cut.c_str()) != 0) std::printf("could not cut the link\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    try {
      double x = me + 1;
      comm->allreduce(&x, 1, DataType::f64, ReduceOp::sum);
      double want = 0;
      for (int m : members) want += m + 1;
      if (x != want) {
        std::printf("wrong: step %d sum %g, not %g\n", step, x, want);
        return 1;
      }
      sum = x;
      ++step;
    } catch (const tandem::Error& e) {
      try {
        tandem::Communicator::Shrunk shrunk = comm->shrink();
        std::vector<int> kept;
        for (int r : shrunk.members) kept.push_back(members[size_t(r)]);
        members = kept;
        comm = std::move(shrunk.comm);
        int64_t agreed = step;
        comm->allreduce(&agreed, 1, DataType::i64, ReduceOp::min);
        step = int(agreed);
        std::string list;
        for (int m : members) list += (list.empty() ? "" : ",") + std::to_string(m);
        std::printf("went on: members %s of %d at step %d\n", list.c_str(), first_size, step);
      } catch (const std::exception& x) {
        std::printf("stopped: %s (after: %s)\n", x.what(), e.what());
        std::fflush(stdout);
        _exit(3);  // the communicator's teardown would wait on a store it cannot reach
      }
    }
  }
  std::printf("done: %d steps, last sum %g right\n", steps, sum);
  std::fflush(stdout);
  return 0;
}
