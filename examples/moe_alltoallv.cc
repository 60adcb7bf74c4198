// Expert parallelism with alltoall/alltoallv: a mixture-of-experts layer with
// one expert (a linear map y = W x + b) per rank. Every rank holds a batch of
// tokens; a top-1 router picks each token's expert; the tokens travel to their
// experts (alltoall of the counts, alltoallv of the vectors), each expert
// processes what it received, the results travel back (alltoallv, the blocks
// swapped) and are scaled by the router's gate. Every rank then compares its
// outputs with all experts applied locally, without communication.
//
//   tandem launch -n 3 -- build/examples/moe_alltoallv      # any number of ranks
#include <tandem/tandem.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

using Mat = Eigen::MatrixXd;  // column-major: one column per token, contiguous
using Vec = Eigen::VectorXd;
using tandem::DataType;

constexpr int kDim = 8;  // token width

struct Expert {
  Mat W;
  Vec b;
  explicit Expert(int e) : W(kDim, kDim), b(kDim) {
    for (int i = 0; i < kDim; ++i) {
      for (int j = 0; j < kDim; ++j) W(i, j) = std::sin(0.3 * e + 1.1 * i + 0.7 * j) / kDim;
      b(i) = 0.1 * std::cos(e + 0.5 * i);
    }
  }
  Mat apply(const Mat& x) const { return (W * x).colwise() + b; }
};

// Rank r's tokens: 10 + 3r of them, deterministic.
Mat tokens(int rank) {
  Mat x(kDim, 10 + 3 * rank);
  for (int t = 0; t < x.cols(); ++t)
    for (int j = 0; j < kDim; ++j) x(j, t) = std::sin(0.5 * (100 * rank + t) + 0.9 * j);
  return x;
}

// Top-1 routing: scores = G x; each token goes to its best expert, weighted by that expert's softmax probability.
void route(const Mat& x, int experts, std::vector<int>* expert, std::vector<double>* gate) {
  Mat G(experts, kDim);
  for (int e = 0; e < experts; ++e)
    for (int j = 0; j < kDim; ++j) G(e, j) = std::sin(1.7 * e + 0.9 * j + 0.3);
  const Mat scores = G * x;
  for (int t = 0; t < x.cols(); ++t) {
    Eigen::Index best;
    const double top = scores.col(t).maxCoeff(&best);
    expert->push_back(int(best));
    gate->push_back(1.0 / (scores.col(t).array() - top).exp().sum());
  }
}

// Blocks of a token exchange: `tokens[p]` tokens for/from rank p, in doubles, packed in rank order.
tandem::Blocks blocks(const std::vector<int64_t>& tokens) {
  tandem::Blocks b;
  size_t offset = 0;
  for (int64_t n : tokens) {
    b.counts.push_back(size_t(n) * kDim);
    b.displs.push_back(offset);
    offset += size_t(n) * kDim;
  }
  return b;
}

int main() try {
  auto comm = tandem::ring::connect_from_env();
  const int rank = comm->rank(), n = comm->size();
  const Mat x = tokens(rank);
  const int T = int(x.cols());
  std::vector<int> expert;
  std::vector<double> gate;
  route(x, n, &expert, &gate);

  // Sort the tokens by expert: column k of `sorted` is token order[k].
  std::vector<int> order(T);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return expert[a] < expert[b]; });
  Mat sorted(kDim, T);
  std::vector<int64_t> send_tokens(n, 0), recv_tokens(n, 0);
  for (int k = 0; k < T; ++k) {
    sorted.col(k) = x.col(order[k]);
    ++send_tokens[expert[order[k]]];
  }

  // 1. How many tokens each expert gets from each rank: one count per peer.
  comm->alltoall(send_tokens.data(), recv_tokens.data(), 1, DataType::i64);
  // 2. The tokens themselves, to their experts.
  const tandem::Blocks to_experts = blocks(send_tokens), from_ranks = blocks(recv_tokens);
  Mat received(kDim, std::accumulate(recv_tokens.begin(), recv_tokens.end(), int64_t(0)));
  comm->alltoallv(sorted.data(), to_experts, received.data(), from_ranks, DataType::f64);
  // 3. This rank's expert on every token it received.
  const Mat processed = Expert(rank).apply(received);
  // 4. The results back to the tokens' ranks: the same blocks, the other way.
  Mat returned(kDim, T);
  comm->alltoallv(processed.data(), from_ranks, returned.data(), to_experts, DataType::f64);
  Mat out(kDim, T);
  for (int k = 0; k < T; ++k) out.col(order[k]) = gate[order[k]] * returned.col(k);

  // The reference: every expert here, each token through its own.
  Mat want(kDim, T);
  for (int t = 0; t < T; ++t) want.col(t) = gate[t] * Expert(expert[t]).apply(x.col(t));
  double diff = T ? (out - want).cwiseAbs().maxCoeff() : 0.0;

  std::printf("rank %d: %d tokens, sent per expert", rank, T);
  for (int64_t c : send_tokens) std::printf(" %lld", (long long)c);
  std::printf(", expert %d processed %ld; max abs difference %.3g\n", rank, long(received.cols()), diff);
  comm->allreduce(&diff, 1, DataType::f64, tandem::ReduceOp::max);  // the worst rank's, on every rank
  std::printf("moe max abs difference: %.3g (%s)\n", diff, diff <= 1e-5 ? "ok" : "TOO LARGE");
  return diff <= 1e-5 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "moe_alltoallv: %s\n", e.what());
  return 1;
}
