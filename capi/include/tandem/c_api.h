/* tandem's C API: a small, stable C99 interface over the C++ library, for
 * binding tandem from any language.
 *
 * Conventions:
 *  - Handles are opaque pointers (tandem_comm_t, tandem_request_t,
 *    tandem_grad_sync_t). Each is created by one call and released by its
 *    destroy/free call; releasing NULL does nothing.
 *  - Every call that can fail returns a tandem_status_t. On failure,
 *    tandem_last_error() gives the message (thread-local, so it describes the
 *    last call that failed on the calling thread) and output parameters are
 *    left untouched (they are set only on success).
 *  - A NULL handle, a NULL output parameter or an out-of-range enum value is
 *    TANDEM_INVALID_ARGUMENT with a message naming the argument, e.g.
 *    "tandem_allreduce: dtype 99 is not a tandem_dtype_t".
 *  - Times are milliseconds as int64_t. A negative timeout means the default:
 *    for collectives the communicator's timeout, for waits the operation's own
 *    deadline.
 *  - Options structs are filled with defaults by their _init() function; new
 *    fields are only ever appended, and struct_size tells the library which
 *    fields the caller knows (fields beyond it keep their defaults).
 *
 * Threads: every call may come from any thread unless its comment says
 * otherwise. Collectives run in the order they are issued, which must be the
 * same on every rank: issue a communicator's collectives from one thread (or
 * serialise them yourself). Distinct handles are independent.
 */
#ifndef TANDEM_C_API_H
#define TANDEM_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, errors, version ------------------------------------------- */

typedef enum tandem_status {
  TANDEM_OK = 0,
  TANDEM_INVALID_ARGUMENT = 1, /* impossible input, or a collective mismatched across ranks */
  TANDEM_TIMEOUT = 2,          /* a deadline passed */
  TANDEM_PEER_FAILURE = 3,     /* a peer process died or its connection broke */
  TANDEM_ABORTED = 4,          /* the communicator was aborted (or failed earlier: errors are sticky) */
  TANDEM_INTERNAL = 5,         /* anything else (out of memory, system errors) */
  TANDEM_REVOKED = 6,          /* a rank revoked the communicator (tandem_comm_revoke) */
  TANDEM_EXCLUDED = 7          /* tandem_comm_shrink left this rank out, or found no majority */
} tandem_status_t;

/* The message of the last call that failed on this thread ("" if none).
 * Owned by the library; valid until the next failing call on this thread. */
const char* tandem_last_error(void);

/* "TANDEM_OK", "TANDEM_TIMEOUT", ...; "unknown status" for other values. Static storage. */
const char* tandem_status_name(tandem_status_t status);

/* The library's version, e.g. 0, 1, 0. Any pointer may be NULL. */
void tandem_version(int* major, int* minor, int* patch);
/* The same as "0.1.0". Static storage. */
const char* tandem_version_string(void);

/* ---- element types and reductions ------------------------------------- */

typedef enum tandem_dtype {
  TANDEM_F32 = 0,
  TANDEM_F64 = 1,
  TANDEM_F16 = 2,  /* IEEE half, as uint16_t bits */
  TANDEM_BF16 = 3, /* bfloat16, as uint16_t bits */
  TANDEM_I32 = 4,
  TANDEM_I64 = 5,
  TANDEM_U8 = 6
} tandem_dtype_t;

/* avg = sum / world size (integer division for integer types). */
typedef enum tandem_reduce_op {
  TANDEM_SUM = 0,
  TANDEM_AVG = 1,
  TANDEM_MIN = 2,
  TANDEM_MAX = 3,
  TANDEM_PROD = 4
} tandem_reduce_op_t;

/* Bytes per element of dtype; 0 for a value that is not a tandem_dtype_t. */
size_t tandem_dtype_size(tandem_dtype_t dtype);

/* ---- communicator ------------------------------------------------------ */

typedef struct tandem_comm tandem_comm_t;

typedef struct tandem_comm_options {
  size_t struct_size;         /* sizeof(tandem_comm_options_t), set by _init */
  int rank;                   /* required: 0 <= rank < size */
  int size;                   /* required: the world size */
  const char* store_address;  /* required: "host:port" of the bootstrap store; copied */
  int host_store;             /* nonzero: this rank (rank 0) starts the store at store_address */
  int64_t timeout_ms;         /* default deadline of every collective (default 300000) */
  int64_t connect_timeout_ms; /* bound of create (default 60000) */
  int shared_memory;          /* nonzero (default): ranks on one host collect through shared memory */
  const char* prefix;         /* store key namespace, for several communicators on one store; NULL = "tandem" */
} tandem_comm_options_t;

/* Defaults; rank, size and store_address still have to be set. */
void tandem_comm_options_init(tandem_comm_options_t* options);

/* Connects to every peer (collective: every rank calls it). *comm is owned by
 * the caller until tandem_comm_destroy. The environment is read here only:
 * UCX_* variables and TANDEM_NETWORK_INTERFACE still apply. */
tandem_status_t tandem_comm_create(const tandem_comm_options_t* options, tandem_comm_t** comm);

/* As tandem_comm_create, with rank, size and store from the environment:
 * TANDEM_* (tandem launch), Open MPI or Slurm variables; TANDEM_TIMEOUT_MS,
 * TANDEM_SHM and the rest as documented in the README. */
tandem_status_t tandem_comm_create_from_env(tandem_comm_t** comm);

/* Releases the communicator. Pending async collectives finish with
 * TANDEM_ABORTED; their requests stay valid (free them as usual). Every
 * grad sync created on it must be destroyed first, and memory from
 * tandem_allocate_shared is released with it. Not concurrently with other
 * calls on the same communicator. NULL is ignored. */
void tandem_comm_destroy(tandem_comm_t* comm);

/* Unblocks every pending and later call on this communicator with
 * TANDEM_ABORTED (sticky). Any thread, any time, also while another thread
 * is blocked in a collective. reason may be NULL. */
tandem_status_t tandem_comm_abort(tandem_comm_t* comm, const char* reason);

/* tandem_comm_abort on every rank: this rank's pending and later calls fail
 * with TANDEM_REVOKED at once, every other rank's within a failure poll
 * (200 ms), whether or not they wait on this rank. The last
 * error names the rank that revoked and its reason (NULL allowed). */
tandem_status_t tandem_comm_revoke(tandem_comm_t* comm, const char* reason);

tandem_status_t tandem_comm_rank(const tandem_comm_t* comm, int* rank);
tandem_status_t tandem_comm_size(const tandem_comm_t* comm, int* size);

/* Sub-communicators (MPI_Comm_split, ncclCommSplit). Collective: every rank
 * calls it. Ranks passing one colour (>= 0) form a new communicator, ranked
 * by (key, rank here); TANDEM_UNDEFINED_COLOR joins none and gives *newcomm
 * = NULL with TANDEM_OK. The new communicator bootstraps through this one's
 * store, is independent of it (each may run collectives while the other
 * does, from different threads) and is released by tandem_comm_destroy.
 * timeout_ms < 0: this communicator's timeout, for the colour exchange. */
#define TANDEM_UNDEFINED_COLOR (-1)
tandem_status_t tandem_comm_split(tandem_comm_t* comm, int color, int key, int64_t timeout_ms, tandem_comm_t** newcomm);
/* The same ranks in the same order, a communicator of their own (MPI_Comm_dup). Collective. */
tandem_status_t tandem_comm_duplicate(tandem_comm_t* comm, int64_t timeout_ms, tandem_comm_t** newcomm);

/* After a failure (MPIX_Comm_shrink, ncclCommShrink): revokes comm, then the
 * ranks that call this agree through the store on one set of members (every
 * caller not recorded as failed nor in any caller's exclude list) and get a
 * new communicator over them, renumbered in comm's order. members (may be
 * NULL) receives comm's ranks in the new order, *n_members their count
 * (members must hold comm's size). TANDEM_EXCLUDED on a rank left out, and on
 * every rank when the members are half of comm or fewer. timeout_ms < 0:
 * comm's timeout. See docs/api.md (membership). */
tandem_status_t tandem_comm_shrink(tandem_comm_t* comm, const int* exclude, int n_exclude, int64_t timeout_ms,
                                   tandem_comm_t** newcomm, int* members, int* n_members);

/* Admits the processes waiting to join (ncclCommGrow): every member calls it
 * at a point they choose, with the same max_new (< 0: all waiting). Joiners
 * are processes created with TANDEM_JOIN=1 (tandem_comm_create_from_env waits
 * in them for this call). *newcomm is NULL and *joined 0 when nobody waits;
 * else *newcomm keeps the members' ranks and gives the *joined joiners the
 * next ones; comm stays valid. timeout_ms < 0: comm's timeout. */
tandem_status_t tandem_comm_grow(tandem_comm_t* comm, int max_new, int64_t timeout_ms, tandem_comm_t** newcomm,
                                 int* joined);
/* How many processes wait to join (one store read on this rank, not
 * collective): share the answer so that every member calls grow together. */
tandem_status_t tandem_comm_joiners_waiting(tandem_comm_t* comm, int64_t timeout_ms, int* waiting);
/* 1 in a communicator made by joining (TANDEM_JOIN), else 0. */
tandem_status_t tandem_comm_joined(const tandem_comm_t* comm, int* joined);

/* Host memory the other ranks on this host can map: collectives whose
 * buffers lie in it on every rank read peers' buffers in place. Page-aligned,
 * zero-filled; ordinary memory when ranks cannot share. Valid until
 * tandem_free_shared or tandem_comm_destroy. */
tandem_status_t tandem_allocate_shared(tandem_comm_t* comm, size_t bytes, void** data);
/* Releases memory from tandem_allocate_shared on this communicator; NULL is ignored. */
tandem_status_t tandem_free_shared(tandem_comm_t* comm, void* data);

/* ---- collectives --------------------------------------------------------
 * Out-of-place when input != output, in-place when equal (reduce_scatter:
 * output == input + rank * count; allgather: input == output + rank * count).
 * Every rank calls the same collectives in the same order with the same
 * count, dtype and op; a rank that does not is named in an
 * TANDEM_INVALID_ARGUMENT on the ranks that can tell. timeout_ms < 0: the
 * communicator's timeout. Blocking forms return when this rank's output is
 * complete. */

tandem_status_t tandem_allreduce(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                 tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms);
/* input: size * count elements (block r for rank r); output: count elements, the reduced block of this rank. */
tandem_status_t tandem_reduce_scatter(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                      tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms);
/* input: count elements; output: size * count elements, rank order. */
tandem_status_t tandem_allgather(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                 tandem_dtype_t dtype, int64_t timeout_ms);
/* root's input reaches every rank's output; input is read on the root only (may be NULL elsewhere). */
tandem_status_t tandem_broadcast(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                 tandem_dtype_t dtype, int root, int64_t timeout_ms);
tandem_status_t tandem_barrier(tandem_comm_t* comm, int64_t timeout_ms);

/* ---- asynchronous collectives -------------------------------------------
 * The same arguments; *request is owned by the caller until
 * tandem_request_free. The buffers must stay valid and untouched until the
 * request has finished (test gave 1, or wait returned anything but
 * TANDEM_TIMEOUT). */

typedef struct tandem_request tandem_request_t;

tandem_status_t tandem_allreduce_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                       tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms,
                                       tandem_request_t** request);
tandem_status_t tandem_reduce_scatter_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                            tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms,
                                            tandem_request_t** request);
tandem_status_t tandem_allgather_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                       tandem_dtype_t dtype, int64_t timeout_ms, tandem_request_t** request);
tandem_status_t tandem_broadcast_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                       tandem_dtype_t dtype, int root, int64_t timeout_ms, tandem_request_t** request);
tandem_status_t tandem_barrier_async(tandem_comm_t* comm, int64_t timeout_ms, tandem_request_t** request);

/* Never blocks. *done = 1 when the collective finished successfully, 0 while
 * it runs; a failed collective returns its error (every time it is tested). */
tandem_status_t tandem_request_test(tandem_request_t* request, int* done);
/* Blocks until the collective finishes and returns its status, or returns
 * TANDEM_TIMEOUT after timeout_ms (the collective keeps running: wait or test
 * again). timeout_ms < 0: up to the collective's own deadline. */
tandem_status_t tandem_request_wait(tandem_request_t* request, int64_t timeout_ms);
/* The rank a finished receive came from (its peer, or the sender for
 * TANDEM_ANY_SOURCE, also within a group); -1 for collectives and for a
 * request not finished successfully (yet). */
tandem_status_t tandem_request_source(const tandem_request_t* request, int* source);
/* Releases the handle. It does not cancel an unfinished collective, whose
 * buffers stay in use until it ends. A request may outlive its communicator.
 * NULL is ignored. */
void tandem_request_free(tandem_request_t* request);

/* ---- all-to-all, rooted and variable-size collectives --------------------
 * Collectives like those above: every rank calls them in the same order (a
 * mismatch is named as above). Counts and displacements are in elements;
 * counts and displs arrays hold one entry per rank (the communicator's
 * size); displs NULL = the blocks packed in rank order. Each has an _async
 * form taking a tandem_request_t** last. */

/* Block p of input (count elements) goes to rank p; block p of output comes
 * from it. In place when input == output. */
tandem_status_t tandem_alltoall(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                tandem_dtype_t dtype, int64_t timeout_ms);
tandem_status_t tandem_alltoall_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                      tandem_dtype_t dtype, int64_t timeout_ms, tandem_request_t** request);
/* send_counts[p] elements at input + send_displs[p] go to rank p;
 * recv_counts[p] elements from rank p land at output + recv_displs[p].
 * send_counts[p] here must equal recv_counts[this rank] on p. Not in place. */
tandem_status_t tandem_alltoallv(tandem_comm_t* comm, const void* input, const size_t* send_counts,
                                 const size_t* send_displs, void* output, const size_t* recv_counts,
                                 const size_t* recv_displs, tandem_dtype_t dtype, int64_t timeout_ms);
tandem_status_t tandem_alltoallv_async(tandem_comm_t* comm, const void* input, const size_t* send_counts,
                                       const size_t* send_displs, void* output, const size_t* recv_counts,
                                       const size_t* recv_displs, tandem_dtype_t dtype, int64_t timeout_ms,
                                       tandem_request_t** request);
/* The op-combination of every rank's input (count elements) lands in root's
 * output; output is written on the root only (may be NULL elsewhere). In
 * place when input == output. */
tandem_status_t tandem_reduce(tandem_comm_t* comm, const void* input, void* output, size_t count, tandem_dtype_t dtype,
                              tandem_reduce_op_t op, int root, int64_t timeout_ms);
tandem_status_t tandem_reduce_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                    tandem_dtype_t dtype, tandem_reduce_op_t op, int root, int64_t timeout_ms,
                                    tandem_request_t** request);
/* Every rank's count elements into root's output: size * count elements,
 * rank order (output may be NULL off the root). */
tandem_status_t tandem_gather(tandem_comm_t* comm, const void* input, void* output, size_t count, tandem_dtype_t dtype,
                              int root, int64_t timeout_ms);
tandem_status_t tandem_gather_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                    tandem_dtype_t dtype, int root, int64_t timeout_ms, tandem_request_t** request);
/* Rank r's count elements land in root's output at displs[r]. output, counts
 * and displs are read on the root only (may be NULL elsewhere); there,
 * counts[root] must equal count. */
tandem_status_t tandem_gatherv(tandem_comm_t* comm, const void* input, size_t count, void* output, const size_t* counts,
                               const size_t* displs, tandem_dtype_t dtype, int root, int64_t timeout_ms);
tandem_status_t tandem_gatherv_async(tandem_comm_t* comm, const void* input, size_t count, void* output,
                                     const size_t* counts, const size_t* displs, tandem_dtype_t dtype, int root,
                                     int64_t timeout_ms, tandem_request_t** request);
/* Root's block r (count elements; input holds size * count, read on the
 * root only) reaches rank r's output. */
tandem_status_t tandem_scatter(tandem_comm_t* comm, const void* input, void* output, size_t count, tandem_dtype_t dtype,
                               int root, int64_t timeout_ms);
tandem_status_t tandem_scatter_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                     tandem_dtype_t dtype, int root, int64_t timeout_ms, tandem_request_t** request);
/* Root's counts[r] elements at input + displs[r] reach rank r's output
 * (count elements, this rank's share). input, counts and displs are read on
 * the root only (may be NULL elsewhere). */
tandem_status_t tandem_scatterv(tandem_comm_t* comm, const void* input, const size_t* counts, const size_t* displs,
                                void* output, size_t count, tandem_dtype_t dtype, int root, int64_t timeout_ms);
tandem_status_t tandem_scatterv_async(tandem_comm_t* comm, const void* input, const size_t* counts,
                                      const size_t* displs, void* output, size_t count, tandem_dtype_t dtype, int root,
                                      int64_t timeout_ms, tandem_request_t** request);
/* Every rank's count elements (counts[rank] of every rank's counts) land in
 * every rank's output at displs[rank]. In place when input == output + displs[rank]. */
tandem_status_t tandem_allgatherv(tandem_comm_t* comm, const void* input, size_t count, void* output,
                                  const size_t* counts, const size_t* displs, tandem_dtype_t dtype, int64_t timeout_ms);
tandem_status_t tandem_allgatherv_async(tandem_comm_t* comm, const void* input, size_t count, void* output,
                                        const size_t* counts, const size_t* displs, tandem_dtype_t dtype,
                                        int64_t timeout_ms, tandem_request_t** request);
/* input holds every rank's block (counts[r] elements at displs[r]); rank r's
 * output receives block r reduced over ranks (counts[r] elements). In place
 * when output == input + displs[rank]. */
tandem_status_t tandem_reduce_scatterv(tandem_comm_t* comm, const void* input, void* output, const size_t* counts,
                                       const size_t* displs, tandem_dtype_t dtype, tandem_reduce_op_t op,
                                       int64_t timeout_ms);
tandem_status_t tandem_reduce_scatterv_async(tandem_comm_t* comm, const void* input, void* output, const size_t* counts,
                                             const size_t* displs, tandem_dtype_t dtype, tandem_reduce_op_t op,
                                             int64_t timeout_ms, tandem_request_t** request);

/* ---- point-to-point -----------------------------------------------------
 * Only the two ranks take part. Calls are posted in issue order and then
 * complete in the background: a send and a receive between two ranks never
 * wait for each other, whatever order each rank issued them in. Tags are the
 * caller's, 0 .. 2^31-1; messages between two ranks with one tag arrive in
 * the order they were sent. A receive buffer must match the message's size
 * exactly (else TANDEM_INVALID_ARGUMENT). Deadlines, abort and dead peers as
 * for collectives; a failure is sticky. A communicator of one rank has no
 * peer: these calls fail there with TANDEM_INVALID_ARGUMENT. */

#define TANDEM_ANY_SOURCE (-1)

tandem_status_t tandem_send(tandem_comm_t* comm, const void* data, size_t count, tandem_dtype_t dtype, int peer,
                            uint32_t tag, int64_t timeout_ms);
tandem_status_t tandem_send_async(tandem_comm_t* comm, const void* data, size_t count, tandem_dtype_t dtype, int peer,
                                  uint32_t tag, int64_t timeout_ms, tandem_request_t** request);
/* peer may be TANDEM_ANY_SOURCE: whichever rank sends with this tag first.
 * *source (may be NULL) is the rank the message came from. */
tandem_status_t tandem_recv(tandem_comm_t* comm, void* data, size_t count, tandem_dtype_t dtype, int peer, uint32_t tag,
                            int64_t timeout_ms, int* source);
/* tandem_recv from TANDEM_ANY_SOURCE; source is required. */
tandem_status_t tandem_recv_any(tandem_comm_t* comm, void* data, size_t count, tandem_dtype_t dtype, uint32_t tag,
                                int64_t timeout_ms, int* source);
/* The source of the finished request: tandem_request_source. */
tandem_status_t tandem_recv_async(tandem_comm_t* comm, void* data, size_t count, tandem_dtype_t dtype, int peer,
                                  uint32_t tag, int64_t timeout_ms, tandem_request_t** request);

/* One message of a group: a send of count elements at data to peer, or a
 * receive into data from peer (TANDEM_ANY_SOURCE: at most one per group). */
typedef enum tandem_p2p_kind { TANDEM_P2P_SEND = 0, TANDEM_P2P_RECV = 1 } tandem_p2p_kind_t;
typedef struct tandem_p2p_op {
  tandem_p2p_kind_t kind;
  void* data; /* read for a send */
  size_t count;
  tandem_dtype_t dtype;
  int peer;
  uint32_t tag;
} tandem_p2p_op_t;

/* Every op of ops[0 .. n) posted at once, one status or request for all
 * (ncclGroupStart/End, torch's batch_isend_irecv); ops is copied. */
tandem_status_t tandem_group(tandem_comm_t* comm, const tandem_p2p_op_t* ops, size_t n, int64_t timeout_ms);
tandem_status_t tandem_group_async(tandem_comm_t* comm, const tandem_p2p_op_t* ops, size_t n, int64_t timeout_ms,
                                   tandem_request_t** request);

/* ---- one call, every operation -------------------------------------------
 * Every operation above is also a tandem_call_t, started by tandem_start (a
 * request) or run by tandem_run (blocking). tandem_op_t lists the operations
 * in the order of tandem's table of operations (docs/api.md, "One call, one
 * table"), which says which fields each reads; an operation added to tandem
 * needs nothing more here than its value. The arrays a call points to
 * (counts, displacements, group ops) are read before tandem_start returns. */

typedef enum tandem_op {
  TANDEM_OP_ALLREDUCE = 0,
  TANDEM_OP_REDUCE_SCATTER,
  TANDEM_OP_ALLGATHER,
  TANDEM_OP_BROADCAST,
  TANDEM_OP_BARRIER,
  TANDEM_OP_ALLTOALL,
  TANDEM_OP_ALLTOALLV,
  TANDEM_OP_REDUCE,
  TANDEM_OP_GATHER,
  TANDEM_OP_GATHERV,
  TANDEM_OP_SCATTER,
  TANDEM_OP_SCATTERV,
  TANDEM_OP_ALLGATHERV,
  TANDEM_OP_REDUCE_SCATTERV,
  TANDEM_OP_SEND,
  TANDEM_OP_RECV,
  TANDEM_OP_GROUP,
  TANDEM_OP_COUNT /* not an operation: how many there are */
} tandem_op_t;

typedef struct tandem_call {
  size_t struct_size; /* sizeof(tandem_call_t), set by tandem_call_init */
  tandem_op_t op;
  const void* input; /* == output for in-place */
  void* output;
  size_t count; /* elements: per rank for fixed-size collectives, this rank's for the v-forms */
  tandem_dtype_t dtype;
  tandem_reduce_op_t reduce;
  int root;
  int peer; /* send, recv (TANDEM_ANY_SOURCE: from anyone) */
  uint32_t tag;
  /* One entry per rank; displacements NULL = packed in rank order. send: how
   * the input divides among ranks (alltoallv, scatterv, reduce_scatterv);
   * recv: how the output does (alltoallv, gatherv, allgatherv). */
  const size_t* send_counts;
  const size_t* send_displs;
  const size_t* recv_counts;
  const size_t* recv_displs;
  const tandem_p2p_op_t* group; /* TANDEM_OP_GROUP: group_size messages */
  size_t group_size;
  int64_t timeout_ms; /* < 0: the communicator's */
} tandem_call_t;

/* Zeroes *call, sets its size, op and a timeout of -1; dtype F32, reduce SUM. */
void tandem_call_init(tandem_call_t* call, tandem_op_t op);
/* "allreduce", ...; NULL for a value that is not a tandem_op_t. */
const char* tandem_op_name(tandem_op_t op);
/* Starts the call; *request as for the _async functions. */
tandem_status_t tandem_start(tandem_comm_t* comm, const tandem_call_t* call, tandem_request_t** request);
/* Runs the call to completion; *source (may be NULL) is a receive's source, else -1. */
tandem_status_t tandem_run(tandem_comm_t* comm, const tandem_call_t* call, int* source);

/* ---- gradient sync ------------------------------------------------------
 * Gradients reduced in fused buckets while backward runs. Register every
 * gradient in model order, finalize (collective), then per step mark each
 * gradient ready as backward produces it and wait before the optimizer step;
 * gradients come back averaged (or summed) in place. While a step is open
 * (first mark_ready to wait returning) the sync owns the communicator: issue
 * no other collective on it. Calls other than mark_ready come from one thread. */

typedef struct tandem_grad_sync tandem_grad_sync_t;

typedef struct tandem_grad_sync_options {
  size_t struct_size;               /* sizeof(tandem_grad_sync_options_t), set by _init */
  size_t fusion_threshold_bytes;    /* largest bucket (default 25 MiB) */
  size_t first_bucket_bytes;        /* the bucket of the last layers, launched first (default 1 MiB) */
  int average;                      /* nonzero (default): divide by the world size, else sum */
  int aggregation_frequency;        /* communicate every k-th step, accumulating in between (default 1) */
  int average_aggregated_gradients; /* nonzero (default): divide by aggregation_frequency too */
  int allow_unused;                 /* nonzero: a gradient not marked ready is reduced as zeros (default 0) */
  int metric_slots;                 /* averaged (sum, count) metrics carried by each step (default 0) */
} tandem_grad_sync_options_t;

void tandem_grad_sync_options_init(tandem_grad_sync_options_t* options);

/* options NULL = defaults. *sync is owned by the caller until
 * tandem_grad_sync_destroy, which must come before the communicator's. */
tandem_status_t tandem_grad_sync_create(tandem_comm_t* comm, const tandem_grad_sync_options_t* options,
                                        tandem_grad_sync_t** sync);
/* Before finalize, in model order. The storage is the sync's (see
 * tandem_grad_sync_data): the framework writes gradients there in place.
 * name is copied. *id is the gradient's id (0, 1, ... in registration order). */
tandem_status_t tandem_grad_sync_register(tandem_grad_sync_t* sync, const char* name, size_t count,
                                          tandem_dtype_t dtype, int* id);
/* As register, but the storage stays the caller's (data, count elements,
 * valid until the sync is destroyed); it is copied into and out of the
 * bucket around each reduction. */
tandem_status_t tandem_grad_sync_register_external(tandem_grad_sync_t* sync, const char* name, void* data, size_t count,
                                                   tandem_dtype_t dtype, int* id);
/* Lays out the buckets and starts the sync's engine thread. Collective: every
 * rank must have registered the same names, counts and dtypes in the same
 * order, else every rank gets TANDEM_INVALID_ARGUMENT naming the first
 * difference. timeout_ms < 0: the communicator's timeout. */
tandem_status_t tandem_grad_sync_finalize(tandem_grad_sync_t* sync, int64_t timeout_ms);
/* The gradient's storage (zero-filled at finalize), valid until destroy. After finalize. */
tandem_status_t tandem_grad_sync_data(tandem_grad_sync_t* sync, int id, void** data);
/* This step's value of gradient id is in its storage. From any thread (autograd
 * hooks); lock-free, never blocks or fails: a bad id or a gradient marked
 * twice is reported by the next tandem_grad_sync_wait. NULL sync is ignored. */
void tandem_grad_sync_mark_ready(tandem_grad_sync_t* sync, int id);
/* This step's metrics (metric_slots of them), before wait. */
typedef struct tandem_metric {
  double sum;
  double count;
} tandem_metric_t;
tandem_status_t tandem_grad_sync_report_metrics(tandem_grad_sync_t* sync, const tandem_metric_t* metrics, size_t n);
/* The averaged metrics of the last communicating step: sum and count summed
 * over ranks (n must equal metric_slots). */
tandem_status_t tandem_grad_sync_metrics(const tandem_grad_sync_t* sync, tandem_metric_t* metrics, size_t n);
/* Ends the step: every gradient reduced in place. TANDEM_INVALID_ARGUMENT
 * names a gradient not marked ready (on every rank), TANDEM_TIMEOUT past
 * timeout_ms (< 0: the communicator's timeout), and the communicator's errors. */
tandem_status_t tandem_grad_sync_wait(tandem_grad_sync_t* sync, int64_t timeout_ms);
/* Zero every gradient (after the optimizer step). */
tandem_status_t tandem_grad_sync_zero(tandem_grad_sync_t* sync);
/* Stops the engine and releases the buckets. NULL is ignored. */
void tandem_grad_sync_destroy(tandem_grad_sync_t* sync);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_C_API_H */
