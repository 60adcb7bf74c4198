// The C API's one call: tandem_call_t as a tandem::Call, started or run. The
// operations come from tandem's table (tandem/call.h); tandem_op_t shares its order.
#include <span>
#include <vector>

#include "c_api_internal.h"

namespace {

using namespace tandem;
using namespace tandem::capi;

static_assert(size_t(TANDEM_OP_COUNT) == size_t(Op::group) + 1, "tandem_op_t lists every operation");
static_assert(size_t(TANDEM_OP_ALLTOALLV) == size_t(Op::alltoallv) && size_t(TANDEM_OP_GROUP) == size_t(Op::group),
              "tandem_op_t shares the table's order");

BlockView view(const Communicator& comm, const size_t* counts, const size_t* displs) {
  const size_t n = counts ? size_t(comm.size()) : 0;
  return {std::span<const size_t>(counts, n), std::span<const size_t>(displs, displs && counts ? n : 0)};
}

// The C++ call, and the group's messages it points to (kept in `group`).
Call call_of(const Communicator& comm, const tandem_call_t* c, std::vector<P2POp>& group, const char* fn) {
  require(c != nullptr, fn, "call is NULL");
  require(c->struct_size >= offsetof(tandem_call_t, timeout_ms) + sizeof(c->timeout_ms), fn,
          "call->struct_size " + std::to_string(c->struct_size) + " is too small: initialise it with tandem_call_init");
  require(int(c->op) >= 0 && int(c->op) < int(TANDEM_OP_COUNT), fn,
          "op " + std::to_string(int(c->op)) + " is not a tandem_op_t");
  Call call;
  call.op = Op(int(c->op));
  call.input = c->input, call.output = c->output, call.count = c->count;
  call.dtype = dtype_of(c->dtype, fn);
  if (operation(call.op).fields & kFieldReduce) call.reduce = op_of(c->reduce, fn);
  call.root = c->root, call.peer = c->peer, call.tag = c->tag;
  call.send = view(comm, c->send_counts, c->send_displs);
  call.recv = view(comm, c->recv_counts, c->recv_displs);
  if (call.op == Op::group) {
    group = ops_of(c->group, c->group_size, fn);
    call.group = group;
  }
  call.options = collective(c->timeout_ms);
  return call;
}

}  // namespace

extern "C" {

void tandem_call_init(tandem_call_t* call, tandem_op_t op) {
  if (!call) return;
  *call = tandem_call_t{};
  call->struct_size = sizeof(tandem_call_t);
  call->op = op;
  call->dtype = TANDEM_F32;
  call->reduce = TANDEM_SUM;
  call->timeout_ms = -1;
}

const char* tandem_op_name(tandem_op_t op) {
  if (int(op) < 0 || int(op) >= int(TANDEM_OP_COUNT)) return nullptr;
  return operation(Op(int(op))).name;
}

tandem_status_t tandem_start(tandem_comm_t* comm, const tandem_call_t* call, tandem_request_t** request) {
  static const char* fn = "tandem_start";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    std::vector<P2POp> group;
    return c.start(call_of(c, call, group, fn));
  });
}

tandem_status_t tandem_run(tandem_comm_t* comm, const tandem_call_t* call, int* source) {
  static const char* fn = "tandem_run";
  return on_comm(fn, comm, [&](Communicator& c) {
    std::vector<P2POp> group;
    const int from = c.run(call_of(c, call, group, fn));
    if (source) *source = from;
  });
}

}  // extern "C"
