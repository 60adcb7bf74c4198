// gloo_allreduce.cc - float32 SUM all-reduce with Debian's libgloo (0.5.0, git 2022-05-18),
// TCP transport on 127.0.0.1, FileStore rendezvous. One process per rank (see run_gloo.sh).
//
// Build: g++ -O3 -march=native -std=c++17 -o gloo_allreduce gloo_allreduce.cc -lgloo -lpthread
// Usage: gloo_allreduce RANK SIZE STOREDIR ALGO SIZES_BYTES_CSV [reps]
//   ALGO: ring      = gloo::allreduce(), AllreduceOptions RING (what torch's ProcessGroupGloo calls)
//         bcube     = gloo::allreduce(), AllreduceOptions BCUBE
//         oldring   = gloo::AllreduceRing<float>          (legacy class API)
//         chunked   = gloo::AllreduceRingChunked<float>   (legacy class API)
//         hd        = gloo::AllreduceHalvingDoubling<float> (legacy class API)
//
// Timing methodology (identical in mpi_allreduce.c and torch_allreduce.py):
//   per size: one correctness op (rank-dependent data, checked), then buffer zeroed;
//   W=clamp(64MiB/bytes,1,10) warm-up ops, 3 ops timed on rank 0 -> K = clamp(BATCH_S/t_op, 1, 2000) ops per batch,
//   broadcast; 1 warm-up batch + REPS timed batches (REPS default 7, BATCH_S default 0.1 s); batch = barrier; t0; K
//   in-place all-reduces; t1; barrier; per-op = (t1-t0)/K on rank 0 (t1 before the closing barrier so the barrier's own
//   cost stays out of the per-op time). Printed: median/min/max per-op over batches. algbw = bytes/median, busbw =
//   algbw*2(n-1)/n.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s RANK SIZE STOREDIR ALGO SIZES_CSV [reps]\n", argv[0]);
    return 2;
  }
  const int rank = atoi(argv[1]), size = atoi(argv[2]);
  const std::string storedir = argv[3], algo = argv[4];
  std::vector<size_t> sizes;
  {
    std::stringstream ss(argv[5]);
    std::string tok;
    while (std::getline(ss, tok, ',')) sizes.push_back(std::stoull(tok));
  }
  const int reps = argc > 6 ? atoi(argv[6]) : 7;
  // target seconds per timed batch (env BATCH_S, default 0.1); K capped at 2000
  const double batch_s = getenv("BATCH_S") ? atof(getenv("BATCH_S")) : 0.1;
  const int64_t kMaxK = 2000;

  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";  // loopback only
  attr.ai_family = AF_INET;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fstore(storedir);
  gloo::rendezvous::PrefixStore store("gloo_bench", fstore);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(store, dev);

  uint32_t tag = 1;
  auto barrier = [&]() {
    gloo::BarrierOptions bo(ctx);
    bo.setTag(tag++);
    gloo::barrier(bo);
  };

  size_t maxbytes = *std::max_element(sizes.begin(), sizes.end());
  float* buf = nullptr;
  if (posix_memalign((void**)&buf, 4096, maxbytes)) return 1;
  memset(buf, 0, maxbytes);

  if (rank == 0) printf("# impl,variant,nranks,bytes,K,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps\n");
  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float);
    std::function<void()> op;
    std::unique_ptr<gloo::Algorithm> legacy;
    if (algo == "ring" || algo == "bcube") {
      op = [&, count]() {
        gloo::AllreduceOptions opts(ctx);
        opts.setAlgorithm(algo == "ring" ? gloo::AllreduceOptions::Algorithm::RING
                                         : gloo::AllreduceOptions::Algorithm::BCUBE);
        opts.setOutput(buf, count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(tag++);
        gloo::allreduce(opts);
      };
    } else {
      std::vector<float*> ptrs{buf};
      if (algo == "oldring")
        legacy.reset(new gloo::AllreduceRing<float>(ctx, ptrs, (int)count));
      else if (algo == "chunked")
        legacy.reset(new gloo::AllreduceRingChunked<float>(ctx, ptrs, (int)count));
      else if (algo == "hd")
        legacy.reset(new gloo::AllreduceHalvingDoubling<float>(ctx, ptrs, (int)count));
      else {
        fprintf(stderr, "unknown algo %s\n", algo.c_str());
        return 2;
      }
      op = [&]() { legacy->run(); };
    }
    // correctness
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1) + (float)(i % 7);
    op();
    const float expect_base = size * (size + 1) / 2.0f;
    for (size_t i = 0; i < count; i++) {
      float e = expect_base + size * (float)(i % 7);
      if (std::fabs(buf[i] - e) > 1e-3f) {
        fprintf(stderr, "rank %d: WRONG at %zu: %f != %f\n", rank, i, buf[i], e);
        return 3;
      }
    }
    memset(buf, 0, bytes);
    // warm-up W = clamp(64MiB/bytes, 1, 10) untimed ops, then calibrate K on rank 0 (3 timed ops), broadcast
    for (size_t w = 0; w < std::max<size_t>(1, std::min<size_t>(10, (64u << 20) / bytes)); w++) op();
    barrier();
    double c0 = now();
    for (int k = 0; k < 3; k++) op();
    double one = (now() - c0) / 3;
    barrier();
    int64_t K = std::max<int64_t>(1, std::min<int64_t>(kMaxK, (int64_t)(batch_s / one)));
    {
      gloo::BroadcastOptions bo(ctx);
      bo.setOutput(&K, 1);
      bo.setRoot(0);
      bo.setTag(tag++);
      gloo::broadcast(bo);
    }
    std::vector<double> t;
    for (int r = -1; r < reps; r++) {
      barrier();
      double t0 = now();
      for (int64_t k = 0; k < K; k++) op();
      double dt = (now() - t0) / K;  // rank 0 cannot finish op K before every rank contributed to it
      barrier();
      if (r >= 0) t.push_back(dt);
    }
    std::sort(t.begin(), t.end());
    double med = t[t.size() / 2];
    double algbw = bytes / med / 1e9, busbw = algbw * 2.0 * (size - 1) / size;
    if (rank == 0) {
      printf("gloo_cpp,%s,%d,%zu,%lld,%d,%.2f,%.2f,%.2f,%.3f,%.3f\n", algo.c_str(), size, bytes, (long long)K, reps,
             med * 1e6, t.front() * 1e6, t.back() * 1e6, algbw, busbw);
      fflush(stdout);
    }
  }
  barrier();
  free(buf);
  return 0;
}
