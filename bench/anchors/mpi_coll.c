// mpi_coll.c - MPI anchors for the collectives beside all-reduce, nccl-tests conventions, float32.
// Build: mpicc -O3 -march=native -o mpi_coll mpi_coll.c        (build.sh does; mpich_coll with mpicc.mpich)
// Usage: mpirun ... mpi_coll OP VARIANT SIZES_CSV [reps]
//   OP: alltoall | sendrecv | reduce | gather | scatter | allgather | reduce_scatter | broadcast | allgatherv |
//       reduce_scatterv (the variable-size forms with equal blocks, as `tandem bench` times them)
//   SIZES are nccl-tests "size": the bytes of the largest buffer of one rank (alltoall: each rank's whole send
//   buffer, n blocks of size/n; gather/scatter/allgather: the root's whole buffer; sendrecv: the message).
// Timing as mpi_allreduce.c: one checked op, warm-up, K ops per batch calibrated on rank 0, REPS batches, median.
// Bus bandwidth factors as nccl-tests: alltoall, gather, scatter, allgather(v), reduce_scatter(v) (n-1)/n;
// sendrecv, reduce, broadcast 1. sendrecv: rank r sends to r+1 and receives from r-1 (a ring), as nccl-tests.
// CSV: impl,variant,nranks,bytes,K,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps  (impl = mpi_<op>)
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static const char* op;
static int rank, size;
static float *sbuf, *rbuf;
static int *counts, *displs;  // allgatherv and reduce_scatterv: every rank's block, packed

static void run(size_t bytes) {
  int n = size, block = (int)(bytes / sizeof(float) / n);
  int count = (int)(bytes / sizeof(float));
  if (!strcmp(op, "alltoall"))
    MPI_Alltoall(sbuf, block, MPI_FLOAT, rbuf, block, MPI_FLOAT, MPI_COMM_WORLD);
  else if (!strcmp(op, "sendrecv"))
    MPI_Sendrecv(sbuf, count, MPI_FLOAT, (rank + 1) % n, 7, rbuf, count, MPI_FLOAT, (rank + n - 1) % n, 7,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  else if (!strcmp(op, "reduce"))
    MPI_Reduce(sbuf, rbuf, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  else if (!strcmp(op, "gather"))
    MPI_Gather(sbuf, block, MPI_FLOAT, rbuf, block, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (!strcmp(op, "scatter"))
    MPI_Scatter(sbuf, block, MPI_FLOAT, rbuf, block, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (!strcmp(op, "allgather"))
    MPI_Allgather(sbuf, block, MPI_FLOAT, rbuf, block, MPI_FLOAT, MPI_COMM_WORLD);
  else if (!strcmp(op, "reduce_scatter"))
    MPI_Reduce_scatter_block(sbuf, rbuf, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(op, "broadcast"))
    MPI_Bcast(sbuf, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (!strcmp(op, "allgatherv") || !strcmp(op, "reduce_scatterv")) {
    for (int p = 0; p < n; p++) counts[p] = block, displs[p] = p * block;
    if (op[0] == 'a')
      MPI_Allgatherv(sbuf, block, MPI_FLOAT, rbuf, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
    else
      MPI_Reduce_scatter(sbuf, rbuf, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    if (!rank) fprintf(stderr, "unknown op %s\n", op);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

// One checked call: every element says where it came from, so a misplaced block is caught.
static void check(size_t bytes) {
  int n = size, block = (int)(bytes / sizeof(float) / n), count = (int)(bytes / sizeof(float));
  for (int i = 0; i < count; i++) sbuf[i] = (float)(rank * 1000 + i % 997);
  memset(rbuf, 0, bytes);
  run(bytes);
  int bad = 0;
  if (!strcmp(op, "alltoall")) {  // block j of rank r came from block r of rank j
    for (int j = 0; j < n && !bad; j++)
      for (int e = 0; e < block; e++)
        if (rbuf[j * block + e] != (float)(j * 1000 + (rank * block + e) % 997)) {
          bad = 1;
          break;
        }
  } else if (!strcmp(op, "sendrecv")) {
    int from = (rank + n - 1) % n;
    for (int i = 0; i < count; i++)
      if (rbuf[i] != (float)(from * 1000 + i % 997)) {
        bad = 1;
        break;
      }
  } else if (!strcmp(op, "reduce") && rank == 0) {
    for (int i = 0; i < count; i++)
      if (fabsf(rbuf[i] - (float)(1000.0 * n * (n - 1) / 2 + n * (i % 997))) > 1e-2f * n) {
        bad = 1;
        break;
      }
  }
  if (bad) {
    fprintf(stderr, "rank %d: %s WRONG at %zu bytes\n", rank, op, bytes);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 4) {
    if (!rank) fprintf(stderr, "usage: %s OP VARIANT SIZES_CSV [reps]\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  op = argv[1];
  const char* variant = argv[2];
  int reps = argc > 4 ? atoi(argv[4]) : 7;
  double batch_s = getenv("BATCH_S") ? atof(getenv("BATCH_S")) : 0.1;
  size_t sizes[64], maxbytes = 0;
  int nsizes = 0;
  char* csv = strdup(argv[3]);
  for (char* tok = strtok(csv, ","); tok && nsizes < 64; tok = strtok(NULL, ","))
    sizes[nsizes++] = strtoull(tok, 0, 10);
  for (int i = 0; i < nsizes; i++)
    if (sizes[i] > maxbytes) maxbytes = sizes[i];
  if (posix_memalign((void**)&sbuf, 4096, maxbytes) || posix_memalign((void**)&rbuf, 4096, maxbytes))
    MPI_Abort(MPI_COMM_WORLD, 1);
  counts = calloc(size, sizeof(int));
  displs = calloc(size, sizeof(int));
  double* t = calloc(reps, sizeof(double));
  double factor = 1.0;
  if (!strcmp(op, "alltoall") || !strcmp(op, "gather") || !strcmp(op, "scatter") || !strncmp(op, "allgather", 9) ||
      !strncmp(op, "reduce_scatter", 14))
    factor = (double)(size - 1) / size;
  if (!rank) printf("# impl,variant,nranks,bytes,K,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps\n");
  for (int si = 0; si < nsizes; si++) {
    size_t bytes = sizes[si] / (sizeof(float) * size) * (sizeof(float) * size);  // whole blocks
    if (!bytes) continue;
    check(bytes);
    size_t W = (64u << 20) / bytes;
    if (W < 1) W = 1;
    if (W > 10) W = 10;
    for (size_t w = 0; w < W; w++) run(bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    double c0 = MPI_Wtime();
    for (int k = 0; k < 3; k++) run(bytes);
    double one = (MPI_Wtime() - c0) / 3;
    MPI_Barrier(MPI_COMM_WORLD);
    long K = (long)(batch_s / one);
    if (K < 1) K = 1;
    if (K > 2000) K = 2000;
    MPI_Bcast(&K, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    for (int r = -1; r < reps; r++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (long k = 0; k < K; k++) run(bytes);
      MPI_Barrier(MPI_COMM_WORLD);  // rooted and point-to-point ops may finish unevenly: time to the last rank
      double dt = (MPI_Wtime() - t0) / K;
      if (r >= 0) t[r] = dt;
    }
    qsort(t, reps, sizeof(double), cmpd);
    if (!rank) {
      double med = t[reps / 2], algbw = bytes / med / 1e9;
      printf("mpi_%s,%s,%d,%zu,%ld,%d,%.3f,%.3f,%.3f,%.4f,%.4f\n", op, variant, size, bytes, K, reps, med * 1e6,
             t[0] * 1e6, t[reps - 1] * 1e6, algbw, algbw * factor);
      fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
