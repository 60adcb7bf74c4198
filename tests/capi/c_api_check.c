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

#define CHECK(cond)                                                                                                    \
  do {                                                                                                                 \
    ++g_checks;                                                                                                        \
    if (!(cond)) {                                                                                                     \
      ++g_failed;                                                                                                      \
      fprintf(stderr, "c_api_check: rank %d: %s:%d: failed: %s (last error: %s)\n", g_rank, __FILE__, __LINE__, #cond, \
              tandem_last_error());                                                                                    \
    }                                                                                                                  \
  } while (0)

#define CHECK_OK(call) CHECK((call) == TANDEM_OK)

/* status is `want` and the last error contains `text`. */
#define CHECK_ERROR(call, want, text)                   \
  do {                                                  \
    tandem_status_t s_ = (call);                        \
    CHECK(s_ == (want));                                \
    CHECK(strstr(tandem_last_error(), (text)) != NULL); \
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
    tandem_request_t *r1 = NULL, *r2 = NULL, *r3 = NULL;
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

/* ---- all-to-all, rooted and variable-size collectives, point-to-point, split ---- */

/* A call's blocking form, or (async nonzero) its _async form waited for:
 * EITHER(async, tandem_gather, comm, ...) with the blocking form's arguments. */
static tandem_request_t* g_request = NULL;
static tandem_status_t finish(tandem_status_t issued) {
  tandem_status_t s = issued;
  if (s == TANDEM_OK) s = tandem_request_wait(g_request, -1);
  tandem_request_free(g_request);
  g_request = NULL;
  return s;
}
#define EITHER(async, fn, ...) ((async) ? finish(fn##_async(__VA_ARGS__, &g_request)) : fn(__VA_ARGS__))

/* counts[p] = p + 1 for every rank p; displs[p] = p * stride (0: packed). */
static void rank_blocks(int n, size_t stride, size_t* counts, size_t* displs) {
  size_t at = 0;
  int p;
  for (p = 0; p < n; ++p) {
    counts[p] = (size_t)p + 1;
    displs[p] = stride ? (size_t)p * stride : at;
    at += counts[p];
  }
}

static void check_alltoall(tandem_comm_t* comm, int rank, int n, int async) {
  enum { MAXN = 8, COUNT = 5, STRIDE = 16 };
  float in[MAXN * STRIDE], out[MAXN * STRIDE];
  size_t counts[MAXN], displs[MAXN], strided[MAXN], at;
  int ok, i, p;
  if (n > MAXN) return;
  /* alltoall: element i of the block for rank p is rank * 100 + p * 10 + i. */
  for (p = 0; p < n; ++p)
    for (i = 0; i < COUNT; ++i) in[p * COUNT + i] = (float)(rank * 100 + p * 10 + i);
  CHECK_OK(EITHER(async, tandem_alltoall, comm, in, out, COUNT, TANDEM_F32, -1));
  for (ok = 1, p = 0; p < n; ++p)
    for (i = 0; i < COUNT; ++i) ok &= out[p * COUNT + i] == (float)(p * 100 + rank * 10 + i);
  CHECK(ok);
  /* alltoallv: rank r sends r + p + 1 elements to p (so receives p + r + 1 from p), packed on the
   * way out and at STRIDE apart on the way in. */
  for (at = 0, p = 0; p < n; ++p) {
    counts[p] = (size_t)(rank + p + 1);
    displs[p] = at, at += counts[p];
    strided[p] = (size_t)p * STRIDE;
    for (i = 0; i < (int)counts[p]; ++i) in[displs[p] + (size_t)i] = (float)(rank * 100 + p * 10 + i);
  }
  for (i = 0; i < MAXN * STRIDE; ++i) out[i] = -1;
  CHECK_OK(EITHER(async, tandem_alltoallv, comm, in, counts, NULL, out, counts, strided, TANDEM_F32, -1));
  for (ok = 1, p = 0; p < n; ++p)
    for (i = 0; i < STRIDE; ++i)
      ok &= out[p * STRIDE + i] == (i < rank + p + 1 ? (float)(p * 100 + rank * 10 + i) : -1.0f);
  CHECK(ok);
  CHECK_ERROR(tandem_alltoallv(comm, in, NULL, NULL, out, counts, NULL, TANDEM_F32, -1), TANDEM_INVALID_ARGUMENT,
              "tandem_alltoallv: send_counts is NULL");
}

/* The one-call entry points: the table's operations through tandem_call_t. */
static void check_call(tandem_comm_t* comm, int rank, int n) {
  enum { MAXN = 8, STRIDE = 16 };
  double x[4] = {rank + 1.0, rank + 2.0, rank + 3.0, rank + 4.0};
  float in[MAXN * STRIDE], out[MAXN * STRIDE];
  size_t counts[MAXN], strided[MAXN];
  tandem_call_t call;
  tandem_request_t* req = NULL;
  int ok, i, p, source = 7;
  CHECK(strcmp(tandem_op_name(TANDEM_OP_ALLTOALLV), "alltoallv") == 0);
  CHECK(strcmp(tandem_op_name(TANDEM_OP_GROUP), "group") == 0 && tandem_op_name(TANDEM_OP_COUNT) == NULL);
  tandem_call_init(&call, TANDEM_OP_ALLREDUCE);
  CHECK(call.struct_size == sizeof call && call.timeout_ms == -1 && call.dtype == TANDEM_F32);
  call.input = x, call.output = x, call.count = 4, call.dtype = TANDEM_F64;
  CHECK_OK(tandem_run(comm, &call, &source));
  CHECK(source == -1);
  for (ok = 1, i = 0; i < 4; ++i) ok &= x[i] == rank_sum(n, 1.0) + (double)n * i;
  CHECK(ok);
  if (n > MAXN) return;
  /* alltoallv started: rank r sends r + p + 1 elements to p, received STRIDE apart. */
  tandem_call_init(&call, TANDEM_OP_ALLTOALLV);
  for (p = 0; p < n; ++p) counts[p] = (size_t)(rank + p + 1), strided[p] = (size_t)p * STRIDE;
  for (i = 0; i < MAXN * STRIDE; ++i) in[i] = (float)i, out[i] = -1;
  call.input = in, call.output = out, call.send_counts = counts, call.recv_counts = counts;
  call.recv_displs = strided;
  CHECK_OK(tandem_start(comm, &call, &req));
  CHECK_OK(tandem_request_wait(req, -1));
  tandem_request_free(req);
  for (ok = 1, p = 0; p < n; ++p) {
    /* p's block for this rank starts after its blocks for ranks 0 .. rank-1 (p + q + 1 each). */
    size_t from = 0;
    int q;
    for (q = 0; q < rank; ++q) from += (size_t)(p + q + 1);
    for (i = 0; i < STRIDE; ++i) ok &= out[p * STRIDE + i] == (i < rank + p + 1 ? (float)(from + (size_t)i) : -1.0f);
  }
  CHECK(ok);
  call.op = (tandem_op_t)99;
  CHECK_ERROR(tandem_run(comm, &call, NULL), TANDEM_INVALID_ARGUMENT, "tandem_run: op 99 is not a tandem_op_t");
  call.op = TANDEM_OP_ALLTOALLV, call.struct_size = 8, req = NULL;
  CHECK_ERROR(tandem_start(comm, &call, &req), TANDEM_INVALID_ARGUMENT, "initialise it with tandem_call_init");
  CHECK(req == NULL);
  if (n < 2 || rank > 1) return;
  /* A send started on rank 0, a receive from any source run on rank 1. */
  tandem_call_init(&call, rank == 0 ? TANDEM_OP_SEND : TANDEM_OP_RECV);
  call.count = 4, call.dtype = TANDEM_F64, call.tag = 5, call.peer = rank == 0 ? 1 : TANDEM_ANY_SOURCE;
  x[0] = 42;
  if (rank == 0) {
    call.input = x;
    CHECK_OK(tandem_start(comm, &call, &req));
    CHECK_OK(tandem_request_wait(req, -1));
    tandem_request_free(req);
  } else {
    call.output = x;
    CHECK_OK(tandem_run(comm, &call, &source));
    CHECK(source == 0 && x[0] == 42);
  }
}

static void check_rooted(tandem_comm_t* comm, int rank, int n, int async) {
  enum { MAXN = 8, COUNT = 300 };
  double in[COUNT], out[COUNT];
  float block[MAXN * 4], all[MAXN * 4];
  size_t counts[MAXN], displs[MAXN];
  char text[128];
  const int last = n - 1;
  int ok, i, p;
  if (n > MAXN) return;
  /* reduce to the last rank, out of place; NULL output elsewhere. */
  for (i = 0; i < COUNT; ++i) in[i] = (rank + 1) * (double)i, out[i] = -1;
  CHECK_OK(EITHER(async, tandem_reduce, comm, in, rank == last ? out : NULL, COUNT, TANDEM_F64, TANDEM_SUM, last, -1));
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= out[i] == (rank == last ? rank_sum(n, i) : -1);
  CHECK(ok);
  /* reduce (max) to rank 0, in place. */
  for (i = 0; i < COUNT; ++i) in[i] = rank + (double)i;
  CHECK_OK(EITHER(async, tandem_reduce, comm, in, in, COUNT, TANDEM_F64, TANDEM_MAX, 0, -1));
  if (rank == 0) CHECK(in[0] == last && in[COUNT - 1] == last + COUNT - 1);
  /* gather to rank 0: rank r's 4 elements are r * 10 + i. */
  for (i = 0; i < 4; ++i) block[i] = (float)(rank * 10 + i);
  CHECK_OK(EITHER(async, tandem_gather, comm, block, rank == 0 ? all : NULL, 4, TANDEM_F32, 0, -1));
  for (ok = 1, p = 0; rank == 0 && p < n; ++p)
    for (i = 0; i < 4; ++i) ok &= all[p * 4 + i] == (float)(p * 10 + i);
  CHECK(ok);
  /* gatherv to the last rank: rank r gives r + 1 elements of value r, packed. */
  rank_blocks(n, 0, counts, displs);
  for (i = 0; i <= rank; ++i) block[i] = (float)rank;
  CHECK_OK(EITHER(async, tandem_gatherv, comm, block, (size_t)rank + 1, all, rank == last ? counts : NULL, NULL,
                  TANDEM_F32, last, -1));
  for (ok = 1, p = 0; rank == last && p < n; ++p)
    for (i = 0; i <= p; ++i) ok &= all[displs[p] + (size_t)i] == (float)p;
  CHECK(ok);
  /* scatter from rank 0: block p is p * 10 + i. */
  for (p = 0; p < n; ++p)
    for (i = 0; i < 4; ++i) all[p * 4 + i] = rank == 0 ? (float)(p * 10 + i) : -1.0f;
  CHECK_OK(EITHER(async, tandem_scatter, comm, rank == 0 ? all : NULL, block, 4, TANDEM_F32, 0, -1));
  for (ok = 1, i = 0; i < 4; ++i) ok &= block[i] == (float)(rank * 10 + i);
  CHECK(ok);
  /* scatterv from the last rank: rank p gets p + 1 elements of 100 + p, from blocks 4 apart. */
  rank_blocks(n, 4, counts, displs);
  for (p = 0; p < n; ++p)
    for (i = 0; i < 4; ++i) all[p * 4 + i] = 100.0f + (float)p;
  CHECK_OK(EITHER(async, tandem_scatterv, comm, all, counts, displs, block, (size_t)rank + 1, TANDEM_F32, last, -1));
  for (ok = 1, i = 0; i <= rank; ++i) ok &= block[i] == 100.0f + (float)rank;
  CHECK(ok);
  /* A root out of range is named, on every rank, before anything is sent. */
  snprintf(text, sizeof text, "reduce: root %d is out of range for world size %d", n, n);
  CHECK_ERROR(tandem_reduce(comm, in, in, COUNT, TANDEM_F64, TANDEM_SUM, n, -1), TANDEM_INVALID_ARGUMENT, text);
  CHECK_ERROR(tandem_gatherv(comm, block, (size_t)rank + 1, all, NULL, NULL, TANDEM_F32, rank, -1),
              TANDEM_INVALID_ARGUMENT, "tandem_gatherv: counts is NULL on the root");
}

static void check_variable_ring(tandem_comm_t* comm, int rank, int n, int async) {
  enum { MAXN = 8, ALL = MAXN * (MAXN + 1) / 2 };
  float in[ALL], out[ALL];
  size_t counts[MAXN], displs[MAXN];
  int ok, i, p;
  if (n > MAXN) return;
  rank_blocks(n, 0, counts, displs);
  /* allgatherv: rank p's p + 1 elements are p * 10 + i. */
  for (i = 0; i <= rank; ++i) in[i] = (float)(rank * 10 + i);
  CHECK_OK(EITHER(async, tandem_allgatherv, comm, in, (size_t)rank + 1, out, counts, displs, TANDEM_F32, -1));
  for (ok = 1, p = 0; p < n; ++p)
    for (i = 0; i <= p; ++i) ok &= out[displs[p] + (size_t)i] == (float)(p * 10 + i);
  CHECK(ok);
  /* reduce_scatterv: element g of every rank's input is (rank + 1) * g; rank r gets its block summed. */
  for (i = 0; i < ALL; ++i) in[i] = (float)((rank + 1) * i);
  CHECK_OK(EITHER(async, tandem_reduce_scatterv, comm, in, out, counts, NULL, TANDEM_F32, TANDEM_SUM, -1));
  for (ok = 1, i = 0; i <= rank; ++i) ok &= out[i] == (float)rank_sum(n, (double)displs[rank] + i);
  CHECK(ok);
  CHECK_ERROR(tandem_allgatherv(comm, in, 1, out, NULL, NULL, TANDEM_F32, -1), TANDEM_INVALID_ARGUMENT,
              "tandem_allgatherv: counts is NULL");
}

static void check_point_to_point(tandem_comm_t* comm, int rank, int n) {
  enum { COUNT = 1000, MAXN = 8 };
  float to_next[COUNT], from_prev[COUNT];
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  tandem_request_t* rx = NULL;
  tandem_request_t* tx = NULL;
  tandem_p2p_op_t ops[2 * MAXN];
  int mine[MAXN], got[MAXN], ok, i, p, source = -2;
  float x = 1;

  if (n == 1) { /* no peer */
    CHECK_ERROR(tandem_send(comm, &x, 1, TANDEM_F32, 0, 0, -1), TANDEM_INVALID_ARGUMENT, "has one rank");
    return;
  }
  if (n > MAXN) return;
  /* A ring exchange without a group: the receive posted first, then the send. */
  for (i = 0; i < COUNT; ++i) to_next[i] = (float)(rank * COUNT + i), from_prev[i] = -1;
  CHECK_OK(tandem_recv_async(comm, from_prev, COUNT, TANDEM_F32, prev, 7, -1, &rx));
  CHECK_OK(tandem_request_source(rx, &source));
  CHECK(source == -1 || source == prev);
  CHECK_OK(tandem_send_async(comm, to_next, COUNT, TANDEM_F32, next, 7, -1, &tx));
  CHECK_OK(tandem_request_wait(rx, -1));
  CHECK_OK(tandem_request_wait(tx, -1));
  CHECK_OK(tandem_request_source(rx, &source));
  CHECK(source == prev);
  for (ok = 1, i = 0; i < COUNT; ++i) ok &= from_prev[i] == (float)(prev * COUNT + i);
  CHECK(ok);
  tandem_request_free(rx);
  tandem_request_free(tx);
  /* Tags keep messages apart: rank 1 receives rank 0's tag 2 before its tag 1. */
  if (rank == 0) {
    double a = 11, b = 22;
    CHECK_OK(tandem_send(comm, &a, 1, TANDEM_F64, 1, 1, -1));
    CHECK_OK(tandem_send(comm, &b, 1, TANDEM_F64, 1, 2, -1));
  } else if (rank == 1) {
    double a = 0, b = 0;
    CHECK_OK(tandem_recv_async(comm, &b, 1, TANDEM_F64, 0, 2, -1, &rx));
    CHECK_OK(tandem_recv(comm, &a, 1, TANDEM_F64, 0, 1, -1, &source));
    CHECK_OK(tandem_request_wait(rx, -1));
    CHECK(a == 11 && b == 22 && source == 0);
    tandem_request_free(rx);
  }
  /* Any source: rank 0 hears once from every other rank, each naming itself. */
  if (rank == 0) {
    int seen = 0, value = -1;
    for (i = 1; i < n; ++i) {
      source = -2;
      if (i % 2)
        CHECK_OK(tandem_recv_any(comm, &value, 1, TANDEM_I32, 9, -1, &source));
      else
        CHECK_OK(tandem_recv(comm, &value, 1, TANDEM_I32, TANDEM_ANY_SOURCE, 9, -1, &source));
      CHECK(source >= 1 && source < n && value == source * 100);
      seen |= 1 << source;
    }
    CHECK(seen == (1 << n) - 2);
  } else {
    int value = rank * 100;
    CHECK_OK(tandem_send(comm, &value, 1, TANDEM_I32, 0, 9, -1));
  }
  /* A group: all-to-all by hand (a send to itself too), blocking then async. */
  for (i = 0; i < 2; ++i) {
    for (p = 0; p < n; ++p) {
      tandem_p2p_op_t r = {TANDEM_P2P_RECV, NULL, 1, TANDEM_I32, 0, 3};
      tandem_p2p_op_t s = {TANDEM_P2P_SEND, NULL, 1, TANDEM_I32, 0, 3};
      mine[p] = rank * 10 + p + i, got[p] = -1;
      r.data = &got[p], r.peer = p, s.data = &mine[p], s.peer = p;
      ops[2 * p] = r, ops[2 * p + 1] = s;
    }
    CHECK_OK(EITHER(i, tandem_group, comm, ops, (size_t)(2 * n), -1));
    for (ok = 1, p = 0; p < n; ++p) ok &= got[p] == p * 10 + rank + i;
    CHECK(ok);
  }
  CHECK_OK(tandem_group(comm, NULL, 0, -1));
  /* Local errors, named before anything is sent. */
  CHECK_ERROR(tandem_send(comm, &x, 1, TANDEM_F32, next, 0x80000000u, -1), TANDEM_INVALID_ARGUMENT,
              "tag 2147483648 is out of range 0..2^31-1");
  CHECK_ERROR(tandem_recv(comm, &x, 1, TANDEM_F32, n, 0, -1, NULL), TANDEM_INVALID_ARGUMENT,
              "is out of range for world size");
  CHECK_ERROR(tandem_recv_any(comm, &x, 1, TANDEM_F32, 0, -1, NULL), TANDEM_INVALID_ARGUMENT,
              "tandem_recv_any: source is NULL");
  ops[0].kind = (tandem_p2p_kind_t)5;
  CHECK_ERROR(tandem_group(comm, ops, 2, -1), TANDEM_INVALID_ARGUMENT, "ops[0].kind 5 is not a tandem_p2p_kind_t");
  CHECK_ERROR(tandem_request_source(NULL, &source), TANDEM_INVALID_ARGUMENT, "tandem_request_source: request is NULL");
}

/* Shrinking the revoked duplicate: nobody failed, so every rank stays, in
 * order; at 3 ranks a second shrink excluding rank 2 leaves it out. */
static void check_shrink(tandem_comm_t* revoked, int rank, int n) {
  tandem_comm_t* all = NULL;
  tandem_comm_t* two = NULL;
  int members[8], count = -1, excluded = 2, r = -1;
  long long v = rank;
  CHECK_OK(tandem_comm_shrink(revoked, NULL, 0, -1, &all, members, &count));
  CHECK(count == n && members[0] == 0 && members[n - 1] == n - 1);
  CHECK_OK(tandem_comm_rank(all, &r));
  CHECK(r == rank);
  CHECK_OK(tandem_broadcast(all, &v, &v, 1, TANDEM_I64, n - 1, -1));
  CHECK(v == n - 1);
  /* Nobody waits to join: no new communicator. */
  two = (tandem_comm_t*)&r;
  CHECK_OK(tandem_comm_grow(all, -1, -1, &two, &count));
  CHECK(two == NULL && count == 0);
  CHECK_OK(tandem_comm_joined(all, &count));
  CHECK(count == 0);
  CHECK_OK(tandem_comm_joiners_waiting(all, -1, &count));
  CHECK(count == 0);
  CHECK_ERROR(tandem_comm_joiners_waiting(all, -1, NULL), TANDEM_INVALID_ARGUMENT,
              "tandem_comm_joiners_waiting: waiting is NULL");
  CHECK_ERROR(tandem_comm_grow(all, -1, -1, NULL, NULL), TANDEM_INVALID_ARGUMENT, "tandem_comm_grow: newcomm is NULL");
  CHECK_ERROR(tandem_comm_shrink(all, NULL, 1, -1, &two, NULL, NULL), TANDEM_INVALID_ARGUMENT,
              "tandem_comm_shrink: exclude is NULL or n_exclude is negative");
  if (n == 3) {
    if (rank == 2) {
      CHECK_ERROR(tandem_comm_shrink(all, &excluded, 1, -1, &two, NULL, NULL), TANDEM_EXCLUDED,
                  "rank 2 was left out of shrink #1 (members 0,1 of 3)");
    } else {
      CHECK_OK(tandem_comm_shrink(all, &excluded, 1, -1, &two, members, &count));
      CHECK(count == 2 && members[0] == 0 && members[1] == 1);
      tandem_comm_destroy(two);
    }
  }
  tandem_comm_destroy(all);
}

static void check_split(tandem_comm_t* comm, int rank, int n) {
  tandem_comm_t* half = NULL;
  tandem_comm_t* some = (tandem_comm_t*)&half; /* set to NULL by a split this rank stays out of */
  tandem_comm_t* dup = NULL;
  int r = -1, size = -1, want_size = 0, p;
  long long v;
  tandem_status_t status;

  /* Even and odd ranks; keys reverse the order. */
  CHECK_OK(tandem_comm_split(comm, rank % 2, -rank, -1, &half));
  if (!half) return;
  for (p = rank % 2; p < n; p += 2) ++want_size;
  CHECK_OK(tandem_comm_rank(half, &r));
  CHECK_OK(tandem_comm_size(half, &size));
  CHECK(size == want_size && r == (want_size - 1) - rank / 2);
  v = rank + 1;
  CHECK_OK(tandem_allreduce(half, &v, &v, 1, TANDEM_I64, TANDEM_SUM, -1));
  CHECK(v == (rank % 2 == 0 ? (long long)(want_size * want_size) : (long long)(want_size * (want_size + 1))));
  /* The last rank joins none. */
  status = tandem_comm_split(comm, rank == n - 1 ? TANDEM_UNDEFINED_COLOR : 0, rank, -1, &some);
  CHECK(status == TANDEM_OK);
  if (status != TANDEM_OK) some = NULL;
  CHECK((some == NULL) == (rank == n - 1));
  if (some) {
    CHECK_OK(tandem_comm_size(some, &size));
    CHECK(size == n - 1);
  }
  /* A duplicate: the same ranks, a broadcast of its own. */
  CHECK_OK(tandem_comm_duplicate(comm, -1, &dup));
  CHECK_OK(tandem_comm_rank(dup, &r));
  CHECK(r == rank);
  v = rank;
  CHECK_OK(tandem_broadcast(dup, &v, &v, 1, TANDEM_I64, n - 1, -1));
  CHECK(v == n - 1);
  /* Rank 0 revokes the duplicate: every rank's next call on it fails with
   * TANDEM_REVOKED naming rank 0's reason; the parent goes on. */
  if (rank == 0) CHECK_OK(tandem_comm_revoke(dup, "checking revoke"));
  CHECK_ERROR(tandem_broadcast(dup, &v, &v, 1, TANDEM_I64, 0, -1), TANDEM_REVOKED,
              "rank 0 revoked the communicator: checking revoke");
  CHECK(strcmp(tandem_status_name(TANDEM_REVOKED), "TANDEM_REVOKED") == 0);
  check_shrink(dup, rank, n);
  CHECK_ERROR(tandem_comm_split(comm, -5, 0, -1, &dup), TANDEM_INVALID_ARGUMENT, "split: color -5 must be >= 0");
  CHECK_ERROR(tandem_comm_duplicate(comm, -1, NULL), TANDEM_INVALID_ARGUMENT, "tandem_comm_duplicate: newcomm is NULL");
  tandem_comm_destroy(dup);
  tandem_comm_destroy(some);
  tandem_comm_destroy(half);
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
  CHECK_ERROR(tandem_grad_sync_metrics(sync, avg, 2), TANDEM_INVALID_ARGUMENT,
              "n is 2 but the sync has 1 metric slots");
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
  int rank = -1, size = -1, async;
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
  for (async = 0; async < 2; ++async) {
    check_alltoall(comm, rank, size, async);
    if (async) check_call(comm, rank, size);
    check_rooted(comm, rank, size, async);
    check_variable_ring(comm, rank, size, async);
  }
  check_point_to_point(comm, rank, size);
  check_split(comm, rank, size);
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
