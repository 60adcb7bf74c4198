// Elastic data-parallel training: a worker lost in the middle of a step costs
// a shrink, not a restart. Each step trains a global batch of kBatch records
// of a linear regression, split among the ranks there are; the gradients are
// summed by an all-reduce. When it fails (a peer died, or another survivor
// already shrank), the survivors shrink to a communicator over themselves and
// redo the step: its partial gradients are dropped, the batch is split anew,
// so every record is trained exactly once and the global batch stays kBatch.
// Rank 0 asks the store whether processes wait to join (a replacement, or a
// worker started on a newly offered slot) and sends the answer with the
// gradients; the step after, the members admit them (grow) and hand them the
// weights and the step by broadcast. At the end every survivor compares its
// weights with the same steps run in one process.
//
//   tandem launch -n 4 --elastic 2:4 --max-restarts 2 -- build/examples/elastic_training --kill 2:40
//   tandem launch -n 2 --elastic 2:4 --host-discovery-script 'echo localhost:4'
//       -- build/examples/elastic_training --grow-to 4 --step-ms 20
//
// --kill N:STEP (repeatable): process N of the job (its first rank, or a
// replacement's number, TANDEM_RANK) kills itself (SIGKILL) at that step;
// --stop N:STEP: it stops itself (SIGSTOP), as a hung process would, and is
// left out once the heartbeat names it. --grow-to N: admit joiners up to N
// ranks (default: the starting size); --step-ms M: each step takes at least
// M ms (time for workers to be offered and join).
#include <signal.h>
#include <tandem/tandem.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

using tandem::DataType;
using tandem::ReduceOp;

constexpr int kFeatures = 8, kRecords = 4096, kBatch = 64, kEpochs = 2;
constexpr int kSteps = kEpochs * kRecords / kBatch;
constexpr double kLearningRate = 0.1;

// Record n of the data set: features on a curve, the target from a fixed linear teacher.
void record(int n, double* x, double* y) {
  *y = 0.5;
  for (int j = 0; j < kFeatures; ++j) {
    x[j] = std::sin(0.013 * n * (j + 1) + j);
    *y += (j % 3 - 1) * 0.7 * x[j];
  }
}

// Adds the squared error's gradient over records [first, last) of the step to g (bias last).
void add_gradient(const std::vector<double>& w, int first, int last, std::vector<double>& g) {
  double x[kFeatures], y;
  for (int n = first; n < last; ++n) {
    record(n % kRecords, x, &y);
    double err = w[kFeatures] - y;
    for (int j = 0; j < kFeatures; ++j) err += w[j] * x[j];
    for (int j = 0; j < kFeatures; ++j) g[j] += err * x[j];
    g[kFeatures] += err;
  }
}

void sgd_step(std::vector<double>& w, const std::vector<double>& g) {
  for (int j = 0; j <= kFeatures; ++j) w[j] -= kLearningRate * g[j] / kBatch;
}

int main(int argc, char** argv) try {
  std::map<int, std::pair<int, int>> fault_at;  // original rank -> (step, signal)
  int grow_to = 0, step_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    int rank = -1, step = -1;
    const bool kill = std::strcmp(argv[i], "--kill") == 0, stop = std::strcmp(argv[i], "--stop") == 0;
    if (std::strcmp(argv[i], "--grow-to") == 0) {
      grow_to = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--step-ms") == 0) {
      step_ms = std::atoi(argv[i + 1]);
    } else if (!(kill || stop) || std::sscanf(argv[i + 1], "%d:%d", &rank, &step) != 2) {
      std::fprintf(stderr,
                   "usage: elastic_training [--kill RANK:STEP | --stop RANK:STEP]... [--grow-to N] [--step-ms M]\n");
      return 2;
    } else {
      fault_at[rank] = {step, kill ? SIGKILL : SIGSTOP};
    }
  }
  auto comm = tandem::ring::connect_from_env();  // a replacement (TANDEM_JOIN=1) returns once admitted
  const char* number_text = std::getenv("TANDEM_RANK");
  const int original = comm->joined() && number_text ? std::atoi(number_text) : comm->rank();
  const int wanted = grow_to > 0 ? grow_to : comm->size();  // the size to grow to
  std::vector<double> w(kFeatures + 1, 0.0), before = w;    // the weights, and before the last step
  int shrinks = 0, grows = 0, step = 0, joiners_waiting = 0;
  // The members hand a joiner the step and the weights.
  const auto share_state = [&] {
    std::vector<double> state{double(step)};
    state.insert(state.end(), w.begin(), w.end());
    state.insert(state.end(), before.begin(), before.end());
    comm->broadcast(state.data(), state.size(), DataType::f64, 0);
    step = int(state[0]);
    w.assign(state.begin() + 1, state.begin() + 2 + kFeatures);
    before.assign(state.begin() + 2 + kFeatures, state.end());
  };
  if (comm->joined()) share_state();
  while (step < kSteps) {
    if (joiners_waiting > 0) {  // every member read it from the same all-reduce
      joiners_waiting = 0;
      if (auto grown = comm->grow(wanted - comm->size()); grown.comm) {
        comm = std::move(grown.comm);
        ++grows;
        share_state();
        if (comm->rank() == 0) std::printf("step %d: %d joined, %d ranks\n", step, grown.joined, comm->size());
      }
    }
    if (fault_at.count(original) && fault_at[original].first == step) raise(fault_at[original].second);
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    // This rank's share of the step's records; then their count, and the joiners waiting.
    const int first = step * kBatch + kBatch * comm->rank() / comm->size();
    const int last = step * kBatch + kBatch * (comm->rank() + 1) / comm->size();
    std::vector<double> g(kFeatures + 3, 0.0);
    add_gradient(w, first, last, g);
    g[kFeatures + 1] = last - first;
    if (comm->rank() == 0 && comm->size() < wanted) g[kFeatures + 2] = comm->joiners_waiting();
    try {
      comm->allreduce(g.data(), g.size(), DataType::f64, ReduceOp::sum);
    } catch (const tandem::Excluded&) {
      throw;  // left out, or no majority: this process must stop
    } catch (const tandem::Error& e) {
      comm = comm->shrink().comm;
      ++shrinks;
      joiners_waiting = 0;  // a survivor whose all-reduce finished read it; the others did not
      // The failed all-reduce may have finished on some survivors (a ring's
      // last message reached them): they took the step, the others did not.
      // The survivors agree on the step to redo; one ahead steps back.
      int64_t agreed = step;
      comm->allreduce(&agreed, 1, DataType::i64, ReduceOp::min);
      if (agreed < step) w = before;
      std::printf("rank %d: step %d redone on %d ranks (%s)\n", original, int(agreed), comm->size(), e.what());
      step = int(agreed);
      continue;
    }
    if (g[kFeatures + 1] != kBatch) {
      std::fprintf(stderr, "rank %d: step %d trained %g records, not %d\n", original, step, g[kFeatures + 1], kBatch);
      return 1;
    }
    joiners_waiting = int(g[kFeatures + 2]);
    g.resize(kFeatures + 1);
    before = w;
    sgd_step(w, g);
    ++step;
  }
  // The same steps in one process: the sums differ only in their order.
  std::vector<double> reference(kFeatures + 1, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<double> g(kFeatures + 1, 0.0);
    add_gradient(reference, step * kBatch, (step + 1) * kBatch, g);
    sgd_step(reference, g);
  }
  double diff = 0;
  for (int j = 0; j <= kFeatures; ++j) diff = std::max(diff, std::abs(w[j] - reference[j]));
  // Every survivor holds the same weights, bit for bit.
  std::vector<double> first_ranks = w;
  comm->broadcast(first_ranks.data(), first_ranks.size(), DataType::f64, 0);
  const bool same = std::memcmp(first_ranks.data(), w.data(), w.size() * sizeof(double)) == 0;
  std::printf(
      "rank %d (now %d of %d): %d steps, %d shrinks, %d grows, weights %s rank 0's, reference max abs difference: "
      "%g\n",
      original, comm->rank(), comm->size(), kSteps, shrinks, grows, same ? "equal to" : "DIFFER from", diff);
  return same && diff < 1e-9 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "elastic_training: %s\n", e.what());
  return 1;
}
