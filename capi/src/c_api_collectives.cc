// The C API of the blocking collectives (all-reduce to barrier), and the
// all-to-all, rooted and variable-size ones: each entry point checks its C
// arguments and calls the C++ one of the same name (the _async forms its
// _async twin).
#include "c_api_internal.h"

namespace {

using namespace tandem;
using namespace tandem::capi;

// Blocks from C arrays of one entry per rank; displs NULL = packed. counts
// may be NULL only where `needed` is false (off the root of a gatherv or
// scatterv, where the C++ call does not read them).
Blocks blocks_of(const Communicator& c, const size_t* counts, const size_t* displs, bool needed, const char* fn,
                 const char* name) {
  require(counts != nullptr || !needed, fn, std::string(name) + " is NULL");
  Blocks b;
  if (!counts) return b;
  const size_t n = size_t(c.size());
  b.counts.assign(counts, counts + n);
  if (displs) b.displs.assign(displs, displs + n);
  return b;
}

Blocks on_root(const Communicator& c, int root, const size_t* counts, const size_t* displs, const char* fn) {
  require(counts != nullptr || c.rank() != root, fn, "counts is NULL on the root");
  return blocks_of(c, counts, displs, false, fn, "counts");
}

}  // namespace

// ---- collectives ----

tandem_status_t tandem_allreduce(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                 tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms) {
  static const char* fn = "tandem_allreduce";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    comm->comm->allreduce(input, output, count, dtype_of(dtype, fn), op_of(op, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_reduce_scatter(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                      tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms) {
  static const char* fn = "tandem_reduce_scatter";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    comm->comm->reduce_scatter(input, output, count, dtype_of(dtype, fn), op_of(op, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_allgather(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                 tandem_dtype_t dtype, int64_t timeout_ms) {
  static const char* fn = "tandem_allgather";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    comm->comm->allgather(input, output, count, dtype_of(dtype, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_broadcast(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                 tandem_dtype_t dtype, int root, int64_t timeout_ms) {
  static const char* fn = "tandem_broadcast";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    // input is read on the root only; NULL is allowed elsewhere.
    comm->comm->broadcast(input ? input : output, output, count, dtype_of(dtype, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_barrier(tandem_comm_t* comm, int64_t timeout_ms) {
  static const char* fn = "tandem_barrier";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    comm->comm->barrier(collective(timeout_ms));
  });
}

extern "C" {

tandem_status_t tandem_alltoall(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                tandem_dtype_t dtype, int64_t timeout_ms) {
  static const char* fn = "tandem_alltoall";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.alltoall(input, output, count, dtype_of(dtype, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_alltoall_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                      tandem_dtype_t dtype, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_alltoall_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.alltoall_async(input, output, count, dtype_of(dtype, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_alltoallv(tandem_comm_t* comm, const void* input, const size_t* send_counts,
                                 const size_t* send_displs, void* output, const size_t* recv_counts,
                                 const size_t* recv_displs, tandem_dtype_t dtype, int64_t timeout_ms) {
  static const char* fn = "tandem_alltoallv";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.alltoallv(input, blocks_of(c, send_counts, send_displs, true, fn, "send_counts"), output,
                blocks_of(c, recv_counts, recv_displs, true, fn, "recv_counts"), dtype_of(dtype, fn),
                collective(timeout_ms));
  });
}

tandem_status_t tandem_alltoallv_async(tandem_comm_t* comm, const void* input, const size_t* send_counts,
                                       const size_t* send_displs, void* output, const size_t* recv_counts,
                                       const size_t* recv_displs, tandem_dtype_t dtype, int64_t timeout_ms,
                                       tandem_request_t** request) {
  static const char* fn = "tandem_alltoallv_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.alltoallv_async(input, blocks_of(c, send_counts, send_displs, true, fn, "send_counts"), output,
                             blocks_of(c, recv_counts, recv_displs, true, fn, "recv_counts"), dtype_of(dtype, fn),
                             collective(timeout_ms));
  });
}

tandem_status_t tandem_reduce(tandem_comm_t* comm, const void* input, void* output, size_t count, tandem_dtype_t dtype,
                              tandem_reduce_op_t op, int root, int64_t timeout_ms) {
  static const char* fn = "tandem_reduce";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.reduce(input, output, count, dtype_of(dtype, fn), op_of(op, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_reduce_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                    tandem_dtype_t dtype, tandem_reduce_op_t op, int root, int64_t timeout_ms,
                                    tandem_request_t** request) {
  static const char* fn = "tandem_reduce_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.reduce_async(input, output, count, dtype_of(dtype, fn), op_of(op, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_gather(tandem_comm_t* comm, const void* input, void* output, size_t count, tandem_dtype_t dtype,
                              int root, int64_t timeout_ms) {
  static const char* fn = "tandem_gather";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.gather(input, output, count, dtype_of(dtype, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_gather_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                    tandem_dtype_t dtype, int root, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_gather_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.gather_async(input, output, count, dtype_of(dtype, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_gatherv(tandem_comm_t* comm, const void* input, size_t count, void* output, const size_t* counts,
                               const size_t* displs, tandem_dtype_t dtype, int root, int64_t timeout_ms) {
  static const char* fn = "tandem_gatherv";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.gatherv(input, count, output, on_root(c, root, counts, displs, fn), dtype_of(dtype, fn), root,
              collective(timeout_ms));
  });
}

tandem_status_t tandem_gatherv_async(tandem_comm_t* comm, const void* input, size_t count, void* output,
                                     const size_t* counts, const size_t* displs, tandem_dtype_t dtype, int root,
                                     int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_gatherv_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.gatherv_async(input, count, output, on_root(c, root, counts, displs, fn), dtype_of(dtype, fn), root,
                           collective(timeout_ms));
  });
}

tandem_status_t tandem_scatter(tandem_comm_t* comm, const void* input, void* output, size_t count, tandem_dtype_t dtype,
                               int root, int64_t timeout_ms) {
  static const char* fn = "tandem_scatter";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.scatter(input, output, count, dtype_of(dtype, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_scatter_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                     tandem_dtype_t dtype, int root, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_scatter_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.scatter_async(input, output, count, dtype_of(dtype, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_scatterv(tandem_comm_t* comm, const void* input, const size_t* counts, const size_t* displs,
                                void* output, size_t count, tandem_dtype_t dtype, int root, int64_t timeout_ms) {
  static const char* fn = "tandem_scatterv";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.scatterv(input, on_root(c, root, counts, displs, fn), output, count, dtype_of(dtype, fn), root,
               collective(timeout_ms));
  });
}

tandem_status_t tandem_scatterv_async(tandem_comm_t* comm, const void* input, const size_t* counts,
                                      const size_t* displs, void* output, size_t count, tandem_dtype_t dtype, int root,
                                      int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_scatterv_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.scatterv_async(input, on_root(c, root, counts, displs, fn), output, count, dtype_of(dtype, fn), root,
                            collective(timeout_ms));
  });
}

tandem_status_t tandem_allgatherv(tandem_comm_t* comm, const void* input, size_t count, void* output,
                                  const size_t* counts, const size_t* displs, tandem_dtype_t dtype,
                                  int64_t timeout_ms) {
  static const char* fn = "tandem_allgatherv";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.allgatherv(input, count, output, blocks_of(c, counts, displs, true, fn, "counts"), dtype_of(dtype, fn),
                 collective(timeout_ms));
  });
}

tandem_status_t tandem_allgatherv_async(tandem_comm_t* comm, const void* input, size_t count, void* output,
                                        const size_t* counts, const size_t* displs, tandem_dtype_t dtype,
                                        int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_allgatherv_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.allgatherv_async(input, count, output, blocks_of(c, counts, displs, true, fn, "counts"),
                              dtype_of(dtype, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_reduce_scatterv(tandem_comm_t* comm, const void* input, void* output, const size_t* counts,
                                       const size_t* displs, tandem_dtype_t dtype, tandem_reduce_op_t op,
                                       int64_t timeout_ms) {
  static const char* fn = "tandem_reduce_scatterv";
  return on_comm(fn, comm, [&](Communicator& c) {
    c.reduce_scatterv(input, output, blocks_of(c, counts, displs, true, fn, "counts"), dtype_of(dtype, fn),
                      op_of(op, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_reduce_scatterv_async(tandem_comm_t* comm, const void* input, void* output, const size_t* counts,
                                             const size_t* displs, tandem_dtype_t dtype, tandem_reduce_op_t op,
                                             int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_reduce_scatterv_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.reduce_scatterv_async(input, output, blocks_of(c, counts, displs, true, fn, "counts"), dtype_of(dtype, fn),
                                   op_of(op, fn), collective(timeout_ms));
  });
}

}  // extern "C"
