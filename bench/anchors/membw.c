// membw.c - physical limit: memory bandwidth of the kernels an all-reduce is made of.
// Build: gcc -O3 -march=native -fopenmp -o membw membw.c
// Usage: membw [threads] [reps] [size_MiB ...]
// Kernels (n = bytes of ONE array, float32):
//   copy   : memcpy(dst, src, n)              traffic 2n (1R+1W)
//   sum3   : c[i] = a[i] + b[i]               traffic 3n (2R+1W)
//   sum2   : a[i] += b[i]  (in-place reduce)  traffic 3n (2R+1W)
//   read   : s += a[i]                        traffic 1n
//   write  : memset(a, ...)                   traffic 1n
// Reported: median over reps of  n/t  ("payload GB/s", bytes of one array per second)
// and traffic GB/s (payload * streams). GB = 1e9 bytes.
// With threads>1 each thread works on its own contiguous slice (OpenMP static).
#define _GNU_SOURCE
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}
static volatile float sink;

__attribute__((noinline)) static void k_sum3(float* restrict c, const float* restrict a, const float* restrict b,
                                             size_t n) {
  for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}
__attribute__((noinline)) static void k_sum2(float* restrict a, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] += b[i];
}
__attribute__((noinline)) static float k_read(const float* restrict a, size_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += a[i];
  return s;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  int reps = argc > 2 ? atoi(argv[2]) : 11;
  size_t sizes_default[] = {1, 16, 64, 256};
  int nsizes = argc > 3 ? argc - 3 : 4;
  omp_set_num_threads(threads);
  printf("# kernel,threads,size_MiB,payload_GBps,traffic_GBps,median_ms\n");
  for (int si = 0; si < nsizes; si++) {
    size_t mib = argc > 3 ? (size_t)atol(argv[3 + si]) : sizes_default[si];
    size_t bytes = mib << 20, n = bytes / sizeof(float);
    float *a = aligned_alloc(4096, bytes), *b = aligned_alloc(4096, bytes), *c = aligned_alloc(4096, bytes);
    if (!a || !b || !c) {
      fprintf(stderr, "alloc failed\n");
      return 1;
    }
    // first touch by the same threads that will use the memory
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
      a[i] = 1.0f;
      b[i] = 2.0f;
      c[i] = 0.0f;
    }
    const char* names[] = {"copy", "sum3", "sum2", "read", "write"};
    const int streams[] = {2, 3, 3, 1, 1};
    // fewer reps for big arrays keep the run bounded; small ones are repeated inside a timed loop
    int inner = bytes >= (64u << 20) ? 1 : (int)((64u << 20) / bytes);
    for (int k = 0; k < 5; k++) {
      double* t = calloc(reps, sizeof(double));
      for (int r = -1; r < reps; r++) {  // r=-1 is warm-up
        double t0 = now();
        for (int it = 0; it < inner; it++) {
#pragma omp parallel
          {
            int tid = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t lo = n * tid / nt, hi = n * (tid + 1) / nt, m = hi - lo;
            switch (k) {
              case 0: memcpy(c + lo, a + lo, m * sizeof(float)); break;
              case 1: k_sum3(c + lo, a + lo, b + lo, m); break;
              case 2: k_sum2(c + lo, b + lo, m); break;
              case 3: {
                float s = k_read(a + lo, m);
                if (s == -1) sink = s;
              } break;
              case 4: memset(c + lo, it & 1, m * sizeof(float)); break;
            }
          }
        }
        double dt = (now() - t0) / inner;
        if (r >= 0) t[r] = dt;
      }
      qsort(t, reps, sizeof(double), cmpd);
      double med = t[reps / 2];
      printf("%s,%d,%zu,%.2f,%.2f,%.4f\n", names[k], threads, mib, bytes / med / 1e9, streams[k] * bytes / med / 1e9,
             med * 1e3);
      fflush(stdout);
      free(t);
    }
    free(a);
    free(b);
    free(c);
  }
  return 0;
}
