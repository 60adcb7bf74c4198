// The C API of point-to-point messages: send, recv (from a rank or any
// source) and groups of them, over Communicator::send/recv/group.
#include <vector>

#include "c_api_internal.h"

namespace tandem::capi {

std::vector<P2POp> ops_of(const tandem_p2p_op_t* ops, size_t n, const char* fn) {
  require(ops != nullptr || n == 0, fn, "ops is NULL for " + std::to_string(n) + " ops");
  std::vector<P2POp> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const tandem_p2p_op_t& o = ops[i];
    require(o.kind == TANDEM_P2P_SEND || o.kind == TANDEM_P2P_RECV, fn,
            "ops[" + std::to_string(i) + "].kind " + std::to_string(int(o.kind)) + " is not a tandem_p2p_kind_t");
    out.push_back(
        {o.kind == TANDEM_P2P_SEND ? P2POp::send : P2POp::recv, o.data, o.count, dtype_of(o.dtype, fn), o.peer, o.tag});
  }
  return out;
}

}  // namespace tandem::capi

namespace {

using namespace tandem;
using namespace tandem::capi;

// tandem_recv and tandem_recv_any; the latter requires `source`.
tandem_status_t receive(const char* fn, tandem_comm_t* comm, void* data, size_t count, tandem_dtype_t dtype, int peer,
                        uint32_t tag, int64_t timeout_ms, int* source, bool need_source) {
  return on_comm(fn, comm, [&](Communicator& c) {
    if (need_source) require_handle(source, fn, "source");
    const int from = c.recv(data, count, dtype_of(dtype, fn), peer, tag, collective(timeout_ms));
    if (source) *source = from;
  });
}

}  // namespace

extern "C" {

tandem_status_t tandem_send(tandem_comm_t* comm, const void* data, size_t count, tandem_dtype_t dtype, int peer,
                            uint32_t tag, int64_t timeout_ms) {
  static const char* fn = "tandem_send";
  return on_comm(fn, comm,
                 [&](Communicator& c) { c.send(data, count, dtype_of(dtype, fn), peer, tag, collective(timeout_ms)); });
}

tandem_status_t tandem_send_async(tandem_comm_t* comm, const void* data, size_t count, tandem_dtype_t dtype, int peer,
                                  uint32_t tag, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_send_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.send_async(data, count, dtype_of(dtype, fn), peer, tag, collective(timeout_ms));
  });
}

tandem_status_t tandem_recv(tandem_comm_t* comm, void* data, size_t count, tandem_dtype_t dtype, int peer, uint32_t tag,
                            int64_t timeout_ms, int* source) {
  return receive("tandem_recv", comm, data, count, dtype, peer, tag, timeout_ms, source, false);
}

tandem_status_t tandem_recv_any(tandem_comm_t* comm, void* data, size_t count, tandem_dtype_t dtype, uint32_t tag,
                                int64_t timeout_ms, int* source) {
  return receive("tandem_recv_any", comm, data, count, dtype, kAnySource, tag, timeout_ms, source, true);
}

tandem_status_t tandem_recv_async(tandem_comm_t* comm, void* data, size_t count, tandem_dtype_t dtype, int peer,
                                  uint32_t tag, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_recv_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.recv_async(data, count, dtype_of(dtype, fn), peer, tag, collective(timeout_ms));
  });
}

tandem_status_t tandem_group(tandem_comm_t* comm, const tandem_p2p_op_t* ops, size_t n, int64_t timeout_ms) {
  static const char* fn = "tandem_group";
  return on_comm(fn, comm, [&](Communicator& c) { c.group(ops_of(ops, n, fn), collective(timeout_ms)); });
}

tandem_status_t tandem_group_async(tandem_comm_t* comm, const tandem_p2p_op_t* ops, size_t n, int64_t timeout_ms,
                                   tandem_request_t** request) {
  static const char* fn = "tandem_group_async";
  return issue_async(fn, comm, request,
                     [&](Communicator& c) { return c.group_async(ops_of(ops, n, fn), collective(timeout_ms)); });
}

}  // extern "C"
