// Pipeline parallelism with send/recv: a two-layer MLP split over two ranks.
// Rank 0 holds layer 1 (h = tanh(W1 x + b1)), rank 1 layer 2 (y = W2 h + b2,
// mean squared error). Each step runs kMicro micro-batches GPipe-style: rank 0
// pushes every micro-batch's activations to rank 1 (send_async), rank 1 sends
// back the loss gradient with respect to them, each stage accumulates its
// gradients and takes one SGD step. Afterwards every rank compares its stage
// with the same model trained in one process without communication.
//
//   tandem launch -n 2 -- build/examples/pipeline_send_recv
#include <tandem/tandem.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

using Mat = Eigen::MatrixXd;  // column-major: one column per sample, contiguous
using Vec = Eigen::VectorXd;
using tandem::DataType;

constexpr int kIn = 4, kHidden = 16, kOut = 2;      // layer sizes
constexpr int kBatch = 8, kMicro = 4, kSteps = 30;  // samples per micro-batch, micro-batches per step, steps
constexpr double kLearningRate = 0.1;

struct Layer {
  Mat W;
  Vec b;
  Mat dW;  // gradients accumulated over a step's micro-batches
  Vec db;
  Layer(int out, int in, double seed) : W(out, in), b(out), dW(Mat::Zero(out, in)), db(Vec::Zero(out)) {
    for (int i = 0; i < out; ++i) {
      for (int j = 0; j < in; ++j) W(i, j) = 0.5 * std::sin(1.1 * i + 0.7 * j + seed);
      b(i) = 0.1 * std::cos(i + seed);
    }
  }
  void sgd_step() {
    W -= kLearningRate * dW;
    b -= kLearningRate * db;
    dW.setZero();
    db.setZero();
  }
};

// Deterministic data: inputs on a curve, targets from a fixed nonlinear "teacher".
Mat inputs(int step, int micro) {
  Mat x(kIn, kBatch);
  for (int s = 0; s < kBatch; ++s) {
    const int n = (step * kMicro + micro) * kBatch + s;
    for (int j = 0; j < kIn; ++j) x(j, s) = std::sin(0.37 * n + 1.3 * j);
  }
  return x;
}
Mat targets(const Mat& x) {
  Mat t(kOut, x.cols());
  for (int s = 0; s < x.cols(); ++s) {
    t(0, s) = x(0, s) * x(1, s);
    t(1, s) = std::sin(x(2, s) + x(3, s));
  }
  return t;
}

// Stage 1 forward: the activations rank 0 sends on.
Mat forward1(const Layer& l1, const Mat& x) { return ((l1.W * x).colwise() + l1.b).array().tanh().matrix(); }

// Stage 2 forward and backward: accumulates layer 2's gradients and returns
// the loss gradient with respect to h (what rank 1 sends back). *loss += the micro-batch's loss.
Mat forward_backward2(Layer& l2, const Mat& h, const Mat& t, double* loss) {
  const Mat err = (l2.W * h).colwise() + l2.b - t;
  *loss += 0.5 * err.squaredNorm() / (kBatch * kMicro);
  const Mat dy = err / (kBatch * kMicro);
  l2.dW += dy * h.transpose();
  l2.db += dy.rowwise().sum();
  return l2.W.transpose() * dy;
}

// Stage 1 backward: through tanh (1 - h^2) into layer 1's gradients.
void backward1(Layer& l1, const Mat& x, const Mat& h, const Mat& dh) {
  const Mat dz = (dh.array() * (1.0 - h.array().square())).matrix();
  l1.dW += dz * x.transpose();
  l1.db += dz.rowwise().sum();
}

double max_abs_diff(const Layer& a, const Layer& b) {
  return std::max((a.W - b.W).cwiseAbs().maxCoeff(), (a.b - b.b).cwiseAbs().maxCoeff());
}

int main() try {
  auto comm = tandem::ring::connect_from_env();
  const int rank = comm->rank();
  if (comm->size() != 2) {
    std::fprintf(stderr, "pipeline_send_recv: needs exactly 2 ranks (one per stage), got %d\n", comm->size());
    return 2;
  }
  Layer l1(kHidden, kIn, 0.0), l2(kOut, kHidden, 2.0);  // rank 0 uses l1, rank 1 l2
  double first_loss = 0, last_loss = 0;

  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    if (rank == 0) {
      std::vector<Mat> x(kMicro), h(kMicro);
      std::vector<tandem::Request> sends;
      for (int m = 0; m < kMicro; ++m) {  // forward: every micro-batch on its way before any gradient returns
        x[m] = inputs(step, m);
        h[m] = forward1(l1, x[m]);
        sends.push_back(comm->send_async(h[m].data(), h[m].size(), DataType::f64, /*peer=*/1, /*tag=*/m));
      }
      Mat dh(kHidden, kBatch);
      for (int m = 0; m < kMicro; ++m) {  // backward, in arrival order of the gradients
        comm->recv(dh.data(), dh.size(), DataType::f64, /*peer=*/1, /*tag=*/m);
        backward1(l1, x[m], h[m], dh);
      }
      for (auto& s : sends) s.wait();  // h[m] must outlive its send
      l1.sgd_step();
    } else {
      std::vector<Mat> dh(kMicro);
      std::vector<tandem::Request> sends;
      Mat h(kHidden, kBatch);
      for (int m = 0; m < kMicro; ++m) {
        comm->recv(h.data(), h.size(), DataType::f64, /*peer=*/0, /*tag=*/m);
        dh[m] = forward_backward2(l2, h, targets(inputs(step, m)), &loss);
        sends.push_back(comm->send_async(dh[m].data(), dh[m].size(), DataType::f64, /*peer=*/0, /*tag=*/m));
      }
      for (auto& s : sends) s.wait();
      l2.sgd_step();
    }
    (step == 0 ? first_loss : last_loss) = loss;
  }

  // The reference: the same model, the same micro-batches, one process.
  Layer r1(kHidden, kIn, 0.0), r2(kOut, kHidden, 2.0);
  for (int step = 0; step < kSteps; ++step) {
    double unused = 0;
    for (int m = 0; m < kMicro; ++m) {
      const Mat x = inputs(step, m), h = forward1(r1, x);
      backward1(r1, x, h, forward_backward2(r2, h, targets(x), &unused));
    }
    r1.sgd_step();
    r2.sgd_step();
  }

  double diff = rank == 0 ? max_abs_diff(l1, r1) : max_abs_diff(l2, r2);
  if (rank == 1) std::printf("loss: step 0 %.6f, step %d %.6f\n", first_loss, kSteps - 1, last_loss);
  std::printf("stage %d: max abs difference from the reference: %.3g\n", rank + 1, diff);
  comm->allreduce(&diff, 1, DataType::f64, tandem::ReduceOp::max);  // the worse of the two stages, on both ranks
  std::printf("pipeline max abs difference: %.3g (%s)\n", diff, diff <= 1e-5 ? "ok" : "TOO LARGE");
  return diff <= 1e-5 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pipeline_send_recv: %s\n", e.what());
  return 1;
}
