/* Every entry point of tandem's C API from C99, error paths included. Run
 * under `tandem launch -n N`; prints "c_api_check: rank R: K checks passed"
 * and exits 0, or names each failed check and exits 1. */
#define _POSIX_C_SOURCE 199309L /* nanosleep */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tandem/c_api.h"

static int g_rank = -1, g_checks = 0, g_failed = 0;

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    ++g_checks;                                                                                  \
    if (!(cond)) {                                                                               \
      ++g_failed;                                                                                \
      fprintf(stderr, "c_api_check: rank %d: %s:%d: failed: %s (last error: %s)\n", g_rank, __FILE__, \
              __LINE__, #cond, tandem_last_error());                                             \
    }                                                                                            \
  } while (0)

#define CHECK_OK(call) CHECK((call) == TANDEM_OK)

/* status is `want` and the last error contains `text`. */
#define CHECK_ERROR(call, want, text)                                              \
  do {                                                                             \
    tandem_status_t s_ = (call);                                                   \
    CHECK(s_ == (want));                                                           \
    CHECK(strstr(tandem_last_error(), (text)) != NULL);                            \
  } while (0)

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

static void check_without_communicator(void) {
  int major = -1, minor = -1, patch = -1;
  char expect[32];
  tandem_comm_options_t o;
  tandem_comm_t* comm = NULL;
  float x = 1;
  tandem_request_t* req = NULL;
  int done = 0;

  CHECK(strcmp(tandem_last_error(), "") == 0);
  tandem_version(&major, &minor, &patch);
  tandem_version(NULL, NULL, NULL);
  snprintf(expect, sizeof expect, "%d.%d.%d", major, minor, patch);
  CHECK(strcmp(tandem_version_string(), expect) == 0);
  CHECK(strcmp(tandem_status_name(TANDEM_TIMEOUT), "TANDEM_TIMEOUT") == 0);
  CHECK(strcmp(tandem_status_name((tandem_status_t)42), "unknown status") == 0);
  CHECK(tandem_dtype_size(TANDEM_F32) == 4 && tandem_dtype_size(TANDEM_F64) == 8);
  CHECK(tandem_dtype_size(TANDEM_BF16) == 2 && tandem_dtype_size(TANDEM_U8) == 1);
  CHECK(tandem_dtype_size((tandem_dtype_t)99) == 0);

  CHECK_ERROR(tandem_comm_create(NULL, &comm), TANDEM_INVALID_ARGUMENT, "tandem_comm_create: options is NULL");
  tandem_comm_options_init(&o);
  CHECK(o.struct_size == sizeof o && o.timeout_ms == 300000 && o.shared_memory == 1);
  o.rank = 5;
  o.size = 2;
  o.store_address = "127.0.0.1:1";
  CHECK_ERROR(tandem_comm_create(&o, &comm), TANDEM_INVALID_ARGUMENT, "rank 5 is outside [0, 2)");
  o.rank = 0;
  o.store_address = NULL;
  CHECK_ERROR(tandem_comm_create(&o, &comm), TANDEM_INVALID_ARGUMENT, "store_address is empty");
  CHECK(comm == NULL); /* outputs untouched on failure */

  CHECK_ERROR(tandem_allreduce(NULL, &x, &x, 1, TANDEM_F32, TANDEM_SUM, -1), TANDEM_INVALID_ARGUMENT,
              "tandem_allreduce: comm is NULL");
  CHECK_ERROR(tandem_barrier_async(NULL, -1, &req), TANDEM_INVALID_ARGUMENT, "tandem_barrier_async: comm is NULL");
  CHECK(req == NULL);
  CHECK_ERROR(tandem_request_test(NULL, &done), TANDEM_INVALID_ARGUMENT, "tandem_request_test: request is NULL");
  CHECK_ERROR(tandem_request_wait(NULL, 0), TANDEM_INVALID_ARGUMENT, "request is NULL");
  CHECK_ERROR(tandem_comm_rank(NULL, &done), TANDEM_INVALID_ARGUMENT, "tandem_comm_rank: comm is NULL");
  CHECK_ERROR(tandem_grad_sync_wait(NULL, 0), TANDEM_INVALID_ARGUMENT, "tandem_grad_sync_wait: sync is NULL");
  tandem_comm_destroy(NULL);
  tandem_request_free(NULL);
  tandem_grad_sync_destroy(NULL);
  tandem_grad_sync_mark_ready(NULL, 0);
}

/* Sum over ranks of (rank + 1) * k: (k n (n + 1)) / 2. */
static double rank_sum(int n, double k) { return k * n * (n + 1) / 2.0; }

static void check_collectives(tandem_comm_t* comm, int rank, int n) {
  enum { COUNT = 1000 };
  float f[COUNT], g[COUNT];
  double d[COUNT];
  long long i64[COUNT];
  float* gathered = malloc(sizeof(float) * COUNT * (size_t)n);
  float* blocks = malloc(sizeof(float) * COUNT * (size_t)n);
  int ok, i, r;

  for (i = 0; i < COUNT; ++i) f[i] = (float)(rank + 1) * (float)(i % 7), d[i] = (rank + 1) * 0.5, i64[i] = rank + 1;
  CHECK_OK(tandem_allreduce(comm, f, g, COUNT, TANDEM_F32, TANDEM_SUM, -1)); /* out of place */
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= g[i] == (float)rank_sum(n, i % 7);
  CHECK(ok);
  CHECK_OK(tandem_allreduce(comm, d, d, COUNT, TANDEM_F64, TANDEM_AVG, 5000)); /* in place */
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= d[i] == rank_sum(n, 0.5) / n;
  CHECK(ok);
  CHECK_OK(tandem_allreduce(comm, i64, i64, COUNT, TANDEM_I64, TANDEM_MAX, -1));
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= i64[i] == n;
  CHECK(ok);
  CHECK_ERROR(tandem_allreduce(comm, f, f, COUNT, (tandem_dtype_t)99, TANDEM_SUM, -1), TANDEM_INVALID_ARGUMENT,
              "tandem_allreduce: dtype 99 is not a tandem_dtype_t");
  CHECK_ERROR(tandem_allreduce(comm, f, f, COUNT, TANDEM_F32, (tandem_reduce_op_t)7, -1), TANDEM_INVALID_ARGUMENT,
              "op 7 is not a tandem_reduce_op_t");
  CHECK_ERROR(tandem_allreduce(comm, NULL, f, COUNT, TANDEM_F32, TANDEM_SUM, -1), TANDEM_INVALID_ARGUMENT,
              "null buffer");

  /* reduce-scatter: block r of every rank holds r + rank; rank r gets sum over ranks. */
  for (r = 0; r < n; ++r)
    for (i = 0; i < COUNT; ++i) blocks[r * COUNT + i] = (float)(r + rank);
  CHECK_OK(tandem_reduce_scatter(comm, blocks, g, COUNT, TANDEM_F32, TANDEM_SUM, -1));
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= g[i] == (float)(n * rank + n * (n - 1) / 2);
  CHECK(ok);
  /* allgather: block r is r's rank + 1. */
  for (i = 0; i < COUNT; ++i) f[i] = (float)(rank + 1);
  CHECK_OK(tandem_allgather(comm, f, gathered, COUNT, TANDEM_F32, -1));
  for (ok = 1, r = 0; r < n; ++r)
    for (i = 0; i < COUNT; ++i) ok &= gathered[r * COUNT + i] == (float)(r + 1);
  CHECK(ok);
  /* broadcast from the last rank; input NULL elsewhere. */
  for (i = 0; i < COUNT; ++i) g[i] = rank == n - 1 ? 42.0f : -1.0f;
  CHECK_OK(tandem_broadcast(comm, rank == n - 1 ? g : NULL, f, COUNT, TANDEM_F32, n - 1, -1));
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= f[i] == 42.0f;
  CHECK(ok);
  CHECK_OK(tandem_barrier(comm, -1));
  free(gathered);
  free(blocks);
}

static void check_async_and_shared(tandem_comm_t* comm, int rank, int n) {
  enum { COUNT = 1 << 16 };
  tandem_request_t* req = NULL;
  float* buf = NULL;
  int done = 0, ok, i, polls = 0;

  CHECK_OK(tandem_allocate_shared(comm, sizeof(float) * COUNT, (void**)&buf));
  CHECK(buf != NULL);
  for (i = 0; i < COUNT; ++i) buf[i] = (float)(rank + 1);
  CHECK_OK(tandem_allreduce_async(comm, buf, buf, COUNT, TANDEM_F32, TANDEM_SUM, -1, &req));
  while (tandem_request_test(req, &done) == TANDEM_OK && !done && polls < 100000) sleep_ms(0), ++polls;
  CHECK(done == 1);
  CHECK_OK(tandem_request_wait(req, -1));
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= buf[i] == (float)rank_sum(n, 1);
  CHECK(ok);
  tandem_request_free(req);
  CHECK_OK(tandem_free_shared(comm, buf));
  CHECK_OK(tandem_free_shared(comm, NULL));
  CHECK_ERROR(tandem_allocate_shared(comm, 16, NULL), TANDEM_INVALID_ARGUMENT, "tandem_allocate_shared: data is NULL");

  /* A barrier the last rank enters late: a short wait times out, and the request still completes. */
  if (n > 1) {
    if (rank == n - 1) sleep_ms(400);
    CHECK_OK(tandem_barrier_async(comm, -1, &req));
    if (rank != n - 1) CHECK_ERROR(tandem_request_wait(req, 20), TANDEM_TIMEOUT, "");
    CHECK_OK(tandem_request_wait(req, -1));
    tandem_request_free(req);
  }
  {
    float a[4] = {1, 2, 3, 4}, out[16];
    tandem_request_t* r1 = NULL, *r2 = NULL, *r3 = NULL;
    CHECK_OK(tandem_reduce_scatter_async(comm, out, a, 0, TANDEM_F32, TANDEM_SUM, -1, &r1));
    CHECK_OK(tandem_allgather_async(comm, a, out, 0, TANDEM_F32, -1, &r2));
    CHECK_OK(tandem_broadcast_async(comm, a, a, 4, TANDEM_F32, 0, -1, &r3));
    CHECK_OK(tandem_request_wait(r1, -1));
    CHECK_OK(tandem_request_wait(r2, -1));
    CHECK_OK(tandem_request_wait(r3, -1));
    CHECK(a[0] == 1 && a[3] == 4);
    tandem_request_free(r1);
    tandem_request_free(r2);
    tandem_request_free(r3);
  }
}

static void check_grad_sync(tandem_comm_t* comm, int rank, int n) {
  tandem_grad_sync_options_t o;
  tandem_grad_sync_t* sync = NULL;
  double external[300];
  float* g0 = NULL;
  float* g1 = NULL;
  int id0 = -1, id1 = -1, id2 = -1, ok, i;
  tandem_metric_t m = {0, 0}, avg[1];

  tandem_grad_sync_options_init(&o);
  CHECK(o.struct_size == sizeof o && o.average == 1 && o.aggregation_frequency == 1);
  o.fusion_threshold_bytes = 8192; /* several buckets */
  o.first_bucket_bytes = 4096;
  o.metric_slots = 1;
  CHECK_OK(tandem_grad_sync_create(comm, &o, &sync));
  if (!sync) return;
  CHECK_OK(tandem_grad_sync_register(sync, "conv.weight", 1000, TANDEM_F32, &id0));
  CHECK_OK(tandem_grad_sync_register(sync, "conv.bias", 10, TANDEM_F32, &id1));
  CHECK_OK(tandem_grad_sync_register_external(sync, "fc.weight", external, 300, TANDEM_F64, &id2));
  CHECK(id0 == 0 && id1 == 1 && id2 == 2);
  CHECK_ERROR(tandem_grad_sync_register(sync, "x", 1, (tandem_dtype_t)-1, &id0), TANDEM_INVALID_ARGUMENT,
              "dtype -1 is not a tandem_dtype_t");
  CHECK_ERROR(tandem_grad_sync_register_external(sync, "y", NULL, 5, TANDEM_F32, &id0), TANDEM_INVALID_ARGUMENT,
              "data is NULL for 5 elements");
  CHECK_OK(tandem_grad_sync_finalize(sync, 30000));
  CHECK_OK(tandem_grad_sync_data(sync, id0, (void**)&g0));
  CHECK_OK(tandem_grad_sync_data(sync, id1, (void**)&g1));
  if (!g0 || !g1) return;

  for (i = 0; i < 1000; ++i) g0[i] = (float)(rank + 1);
  for (i = 0; i < 10; ++i) g1[i] = (float)(2 * (rank + 1));
  for (i = 0; i < 300; ++i) external[i] = rank + 1 + i;
  m.sum = rank + 1;
  m.count = 1;
  tandem_grad_sync_mark_ready(sync, id2); /* backward: last layer first */
  tandem_grad_sync_mark_ready(sync, id1);
  tandem_grad_sync_mark_ready(sync, id0);
  CHECK_OK(tandem_grad_sync_report_metrics(sync, &m, 1));
  CHECK_OK(tandem_grad_sync_wait(sync, 30000));
  for (ok = 1, i = 0; i < 1000; ++i) ok &= g0[i] == (float)(rank_sum(n, 1) / n);
  for (i = 0; i < 10; ++i) ok &= g1[i] == (float)(rank_sum(n, 2) / n);
  for (i = 0; i < 300; ++i) ok &= external[i] == rank_sum(n, 1) / n + i;
  CHECK(ok);
  CHECK_OK(tandem_grad_sync_metrics(sync, avg, 1));
  CHECK(avg[0].sum == rank_sum(n, 1) && avg[0].count == n);
  CHECK_ERROR(tandem_grad_sync_metrics(sync, avg, 2), TANDEM_INVALID_ARGUMENT, "n is 2 but the sync has 1 metric slots");
  CHECK_OK(tandem_grad_sync_zero(sync));
  CHECK(g0[0] == 0 && g1[9] == 0);

  /* A gradient never marked ready: every rank is told its name. */
  tandem_grad_sync_mark_ready(sync, id2);
  tandem_grad_sync_mark_ready(sync, id1);
  CHECK_ERROR(tandem_grad_sync_wait(sync, 30000), TANDEM_INVALID_ARGUMENT, "conv.weight");
  tandem_grad_sync_destroy(sync);

  /* Registrations that differ across ranks fail at finalize on every rank, naming the tensor. */
  if (n > 1) {
    CHECK_OK(tandem_grad_sync_create(comm, NULL, &sync));
    CHECK_OK(tandem_grad_sync_register(sync, "w", rank == 0 ? 100 : 101, TANDEM_F32, &id0));
    CHECK_ERROR(tandem_grad_sync_finalize(sync, 30000), TANDEM_INVALID_ARGUMENT, "'w'");
    tandem_grad_sync_destroy(sync);
  }
}

int main(void) {
  tandem_comm_t* comm = NULL;
  int rank = -1, size = -1;
  float x = 1;

  check_without_communicator();
  if (tandem_comm_create_from_env(&comm) != TANDEM_OK) {
    fprintf(stderr, "c_api_check: tandem_comm_create_from_env: %s\n", tandem_last_error());
    return 1;
  }
  CHECK_OK(tandem_comm_rank(comm, &rank));
  CHECK_OK(tandem_comm_size(comm, &size));
  CHECK_ERROR(tandem_comm_size(comm, NULL), TANDEM_INVALID_ARGUMENT, "tandem_comm_size: size is NULL");
  g_rank = rank;
  check_collectives(comm, rank, size);
  check_async_and_shared(comm, rank, size);
  check_grad_sync(comm, rank, size);

  /* Abort is sticky: every later call fails with TANDEM_ABORTED and the reason. */
  CHECK_OK(tandem_comm_abort(comm, "checks done"));
  CHECK_ERROR(tandem_allreduce(comm, &x, &x, 1, TANDEM_F32, TANDEM_SUM, -1), TANDEM_ABORTED, "checks done");
  tandem_comm_destroy(comm);

  if (g_failed) {
    fprintf(stderr, "c_api_check: rank %d: %d of %d checks failed\n", rank, g_failed, g_checks);
    return 1;
  }
  printf("c_api_check: rank %d: %d checks passed\n", rank, g_checks);
  return 0;
}
