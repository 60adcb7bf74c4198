// mpi_allreduce.c - float32 SUM MPI_Allreduce (in place) benchmark.
// Build: mpicc -O3 -march=native -o mpi_allreduce mpi_allreduce.c
// Usage: mpirun --allow-run-as-root --oversubscribe -np N [mca...] mpi_allreduce VARIANT SIZES_CSV [reps]
//   VARIANT is only a label printed in the CSV.
// Timing methodology identical to gloo_allreduce.cc / torch_allreduce.py:
//   per size: one checked op (rank-dependent data), buffer zeroed; W=clamp(64MiB/bytes,1,10) warm-up ops, 3 ops timed
//   on rank 0 -> K = clamp(BATCH_S/t_op, 1, 2000) ops per batch, broadcast; 1 warm-up batch + REPS timed batches; batch
//   = MPI_Barrier; t0; K ops; t1; MPI_Barrier (t1 on rank 0 before the closing barrier); per-op = (t1-t0)/K on rank 0;
//   median/min/max over batches; algbw = bytes/median; busbw = algbw*2(n-1)/n.
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 3) {
    if (!rank) fprintf(stderr, "usage: %s VARIANT SIZES_CSV [reps]\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char* variant = argv[1];
  int reps = argc > 3 ? atoi(argv[3]) : 7;
  double batch_s = getenv("BATCH_S") ? atof(getenv("BATCH_S")) : 0.1;  // target seconds per timed batch
  size_t sizes[64];
  int nsizes = 0;
  char* csv = strdup(argv[2]);
  for (char* tok = strtok(csv, ","); tok && nsizes < 64; tok = strtok(NULL, ","))
    sizes[nsizes++] = strtoull(tok, 0, 10);
  size_t maxbytes = 0;
  for (int i = 0; i < nsizes; i++)
    if (sizes[i] > maxbytes) maxbytes = sizes[i];
  float* buf;
  if (posix_memalign((void**)&buf, 4096, maxbytes)) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(buf, 0, maxbytes);
  double* t = calloc(reps, sizeof(double));
  if (!rank) printf("# impl,variant,nranks,bytes,K,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps\n");
  for (int si = 0; si < nsizes; si++) {
    size_t bytes = sizes[si], count = bytes / sizeof(float);
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1) + (float)(i % 7);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    float base = size * (size + 1) / 2.0f;
    for (size_t i = 0; i < count; i++) {
      float e = base + size * (float)(i % 7);
      if (fabsf(buf[i] - e) > 1e-3f) {
        fprintf(stderr, "rank %d WRONG at %zu: %f != %f\n", rank, i, buf[i], e);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
    }
    memset(buf, 0, bytes);
    // warm-up W = clamp(64MiB/bytes, 1, 10) untimed ops, then calibrate K on rank 0 (3 timed ops), broadcast
    size_t W = (64u << 20) / bytes;
    if (W < 1) W = 1;
    if (W > 10) W = 10;
    for (size_t w = 0; w < W; w++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double c0 = MPI_Wtime();
    for (int k = 0; k < 3; k++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double one = (MPI_Wtime() - c0) / 3;
    MPI_Barrier(MPI_COMM_WORLD);
    long K = (long)(batch_s / one);
    if (K < 1) K = 1;
    if (K > 2000) K = 2000;
    MPI_Bcast(&K, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    for (int r = -1; r < reps; r++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (long k = 0; k < K; k++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double dt = (MPI_Wtime() - t0) / K;  // rank 0 cannot finish op K before every rank contributed
      MPI_Barrier(MPI_COMM_WORLD);
      if (r >= 0) t[r] = dt;
    }
    qsort(t, reps, sizeof(double), cmpd);
    double med = t[reps / 2], algbw = bytes / med / 1e9, busbw = algbw * 2.0 * (size - 1) / size;
    if (!rank) {
      printf("mpi,%s,%d,%zu,%ld,%d,%.2f,%.2f,%.2f,%.3f,%.3f\n", variant, size, bytes, K, reps, med * 1e6, t[0] * 1e6,
             t[reps - 1] * 1e6, algbw, busbw);
      fflush(stdout);
    }
  }
  free(t);
  free(buf);
  free(csv);
  MPI_Finalize();
  return 0;
}
