// The C API: a thin layer over the C++ one. Every entry point turns the C++
// exceptions into a status and the thread-local message; none lets one escape.
// Here: status and version, communicators (split and duplicate too), the
// first collectives, requests and the gradient sync; the all-to-all, rooted
// and variable-size collectives are in c_api_collectives.cc, point-to-point
// messages in c_api_p2p.cc, what they share in c_api_internal.h.
#include "tandem/c_api.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "c_api_internal.h"
#include "tandem/fusion/gradient_sync.h"
#include "tandem/tandem.h"

#ifndef TANDEM_VERSION_MAJOR
#error "TANDEM_VERSION_MAJOR/MINOR/PATCH come from the build"
#endif

struct tandem_grad_sync {
  tandem_comm* owner = nullptr;
  std::unique_ptr<tandem::fusion::GradientSync> sync;
  int metric_slots = 0;
};

namespace tandem::capi {

namespace {
thread_local std::string g_last_error;
}  // namespace

tandem_status_t fail(tandem_status_t status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

}  // namespace tandem::capi

namespace {

using namespace tandem;
using namespace tandem::capi;

Deadline deadline_in(const Communicator& c, int64_t timeout_ms) {
  return Clock::now() + (timeout_ms >= 0 ? std::chrono::milliseconds(timeout_ms) : c.options().timeout);
}

// Copies the fields a caller's (possibly older, shorter) options struct has over the defaults.
template <typename T>
T with_defaults(const T* given, void (*init)(T*)) {
  T o;
  init(&o);
  if (given) {
    const size_t n = given->struct_size < sizeof(T) ? given->struct_size : sizeof(T);
    std::memcpy(static_cast<void*>(&o), given, n);
    o.struct_size = sizeof(T);
  }
  return o;
}

}  // namespace

extern "C" {

const char* tandem_last_error(void) { return tandem::capi::g_last_error.c_str(); }

const char* tandem_status_name(tandem_status_t status) {
  switch (status) {
    case TANDEM_OK: return "TANDEM_OK";
    case TANDEM_INVALID_ARGUMENT: return "TANDEM_INVALID_ARGUMENT";
    case TANDEM_TIMEOUT: return "TANDEM_TIMEOUT";
    case TANDEM_PEER_FAILURE: return "TANDEM_PEER_FAILURE";
    case TANDEM_ABORTED: return "TANDEM_ABORTED";
    case TANDEM_INTERNAL: return "TANDEM_INTERNAL";
    case TANDEM_REVOKED: return "TANDEM_REVOKED";
    case TANDEM_EXCLUDED: return "TANDEM_EXCLUDED";
  }
  return "unknown status";
}

void tandem_version(int* major, int* minor, int* patch) {
  if (major) *major = TANDEM_VERSION_MAJOR;
  if (minor) *minor = TANDEM_VERSION_MINOR;
  if (patch) *patch = TANDEM_VERSION_PATCH;
}

const char* tandem_version_string(void) { return TANDEM_VERSION_STRING; }

size_t tandem_dtype_size(tandem_dtype_t dtype) {
  if (int(dtype) < int(TANDEM_F32) || int(dtype) > int(TANDEM_U8)) return 0;
  return dtype_size(DataType(int(dtype)));
}

// ---- communicator ----

void tandem_comm_options_init(tandem_comm_options_t* o) {
  if (!o) return;
  const CommOptions d;
  const ring::RingOptions ring_defaults;
  *o = tandem_comm_options_t{};
  o->struct_size = sizeof *o;
  o->rank = -1;
  o->size = -1;
  o->timeout_ms = d.timeout.count();
  o->connect_timeout_ms = d.connect_timeout.count();
  o->shared_memory = ring_defaults.shared_memory ? 1 : 0;
}

tandem_status_t tandem_comm_create(const tandem_comm_options_t* options, tandem_comm_t** comm) {
  static const char* fn = "tandem_comm_create";
  return guard(fn, [&] {
    require_handle(options, fn, "options");
    require_handle(comm, fn, "comm");
    const tandem_comm_options_t o = with_defaults(options, tandem_comm_options_init);
    require(o.size >= 1, fn, "size " + std::to_string(o.size) + " must be >= 1");
    require(o.rank >= 0 && o.rank < o.size, fn,
            "rank " + std::to_string(o.rank) + " is outside [0, " + std::to_string(o.size) + ")");
    require(o.store_address && *o.store_address, fn, "store_address is empty: give \"host:port\" of the store");
    require(o.timeout_ms > 0 && o.connect_timeout_ms > 0, fn, "timeout_ms and connect_timeout_ms must be > 0");
    CommOptions co;  // explicit options: of the environment only UCX_* and the interface override apply
    co.network_interface = network_interface_from_env();
    co.rank = o.rank;
    co.size = o.size;
    co.store_address = o.store_address;
    co.host_store = o.host_store != 0;
    co.timeout = std::chrono::milliseconds(o.timeout_ms);
    co.connect_timeout = std::chrono::milliseconds(o.connect_timeout_ms);
    ring::RingOptions ro;
    ro.shared_memory = o.shared_memory != 0;
    if (o.prefix && *o.prefix) co.prefix = o.prefix;
    *comm = handle_of(ring::connect(co, ro));
  });
}

tandem_status_t tandem_comm_create_from_env(tandem_comm_t** comm) {
  static const char* fn = "tandem_comm_create_from_env";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    *comm = handle_of(ring::connect_from_env());
  });
}

void tandem_comm_destroy(tandem_comm_t* comm) { delete comm; }

tandem_status_t tandem_comm_abort(tandem_comm_t* comm, const char* reason) {
  static const char* fn = "tandem_comm_abort";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    comm->comm->abort(reason ? reason : "tandem_comm_abort called");
  });
}

tandem_status_t tandem_comm_revoke(tandem_comm_t* comm, const char* reason) {
  static const char* fn = "tandem_comm_revoke";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    comm->comm->revoke(reason ? reason : "tandem_comm_revoke called");
  });
}

tandem_status_t tandem_comm_rank(const tandem_comm_t* comm, int* rank) {
  static const char* fn = "tandem_comm_rank";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    require_handle(rank, fn, "rank");
    *rank = comm->comm->rank();
  });
}

tandem_status_t tandem_comm_size(const tandem_comm_t* comm, int* size) {
  static const char* fn = "tandem_comm_size";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    require_handle(size, fn, "size");
    *size = comm->comm->size();
  });
}

tandem_status_t tandem_comm_split(tandem_comm_t* comm, int color, int key, int64_t timeout_ms,
                                  tandem_comm_t** newcomm) {
  static const char* fn = "tandem_comm_split";
  return on_comm(fn, comm, [&](Communicator& c) {
    require_handle(newcomm, fn, "newcomm");
    *newcomm = handle_of(c.split(color, key, collective(timeout_ms)));
  });
}

tandem_status_t tandem_comm_duplicate(tandem_comm_t* comm, int64_t timeout_ms, tandem_comm_t** newcomm) {
  static const char* fn = "tandem_comm_duplicate";
  return on_comm(fn, comm, [&](Communicator& c) {
    require_handle(newcomm, fn, "newcomm");
    *newcomm = handle_of(c.duplicate(collective(timeout_ms)));
  });
}

tandem_status_t tandem_comm_shrink(tandem_comm_t* comm, const int* exclude, int n_exclude, int64_t timeout_ms,
                                   tandem_comm_t** newcomm, int* members, int* n_members) {
  static const char* fn = "tandem_comm_shrink";
  return on_comm(fn, comm, [&](Communicator& c) {
    require_handle(newcomm, fn, "newcomm");
    if (n_exclude < 0 || (n_exclude > 0 && !exclude)) {
      throw InvalidArgument(std::string(fn) + ": exclude is NULL or n_exclude is negative");
    }
    Communicator::Shrunk shrunk = c.shrink(std::vector<int>(exclude, exclude + n_exclude), collective(timeout_ms));
    if (members) std::copy(shrunk.members.begin(), shrunk.members.end(), members);
    if (n_members) *n_members = int(shrunk.members.size());
    *newcomm = handle_of(std::move(shrunk.comm));
  });
}

tandem_status_t tandem_comm_grow(tandem_comm_t* comm, int max_new, int64_t timeout_ms, tandem_comm_t** newcomm,
                                 int* joined) {
  static const char* fn = "tandem_comm_grow";
  return on_comm(fn, comm, [&](Communicator& c) {
    require_handle(newcomm, fn, "newcomm");
    Communicator::Grown grown = c.grow(max_new < 0 ? std::numeric_limits<int>::max() : max_new, collective(timeout_ms));
    if (joined) *joined = grown.joined;
    *newcomm = grown.comm ? handle_of(std::move(grown.comm)) : nullptr;
  });
}

tandem_status_t tandem_comm_joiners_waiting(tandem_comm_t* comm, int64_t timeout_ms, int* waiting) {
  static const char* fn = "tandem_comm_joiners_waiting";
  return on_comm(fn, comm, [&](Communicator& c) {
    require_handle(waiting, fn, "waiting");
    *waiting = c.joiners_waiting(collective(timeout_ms));
  });
}

tandem_status_t tandem_comm_joined(const tandem_comm_t* comm, int* joined) {
  static const char* fn = "tandem_comm_joined";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    require_handle(joined, fn, "joined");
    *joined = comm->comm->joined() ? 1 : 0;
  });
}

tandem_status_t tandem_allocate_shared(tandem_comm_t* comm, size_t bytes, void** data) {
  static const char* fn = "tandem_allocate_shared";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    require_handle(data, fn, "data");
    *data = comm->comm->allocate_shared(bytes);
  });
}

tandem_status_t tandem_free_shared(tandem_comm_t* comm, void* data) {
  static const char* fn = "tandem_free_shared";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    if (data) comm->comm->free_shared(data);
  });
}

// ---- asynchronous collectives ----

tandem_status_t tandem_allreduce_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                       tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms,
                                       tandem_request_t** request) {
  static const char* fn = "tandem_allreduce_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.allreduce_async(input, output, count, dtype_of(dtype, fn), op_of(op, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_reduce_scatter_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                            tandem_dtype_t dtype, tandem_reduce_op_t op, int64_t timeout_ms,
                                            tandem_request_t** request) {
  static const char* fn = "tandem_reduce_scatter_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.reduce_scatter_async(input, output, count, dtype_of(dtype, fn), op_of(op, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_allgather_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                       tandem_dtype_t dtype, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_allgather_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.allgather_async(input, output, count, dtype_of(dtype, fn), collective(timeout_ms));
  });
}

tandem_status_t tandem_broadcast_async(tandem_comm_t* comm, const void* input, void* output, size_t count,
                                       tandem_dtype_t dtype, int root, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_broadcast_async";
  return issue_async(fn, comm, request, [&](Communicator& c) {
    return c.broadcast_async(input ? input : output, output, count, dtype_of(dtype, fn), root, collective(timeout_ms));
  });
}

tandem_status_t tandem_barrier_async(tandem_comm_t* comm, int64_t timeout_ms, tandem_request_t** request) {
  static const char* fn = "tandem_barrier_async";
  return issue_async(fn, comm, request, [&](Communicator& c) { return c.barrier_async(collective(timeout_ms)); });
}

tandem_status_t tandem_request_test(tandem_request_t* request, int* done) {
  static const char* fn = "tandem_request_test";
  return guard(fn, [&] {
    require_handle(request, fn, "request");
    require_handle(done, fn, "done");
    *done = request->request.test() ? 1 : 0;
  });
}

tandem_status_t tandem_request_wait(tandem_request_t* request, int64_t timeout_ms) {
  static const char* fn = "tandem_request_wait";
  return guard(fn, [&] {
    require_handle(request, fn, "request");
    if (timeout_ms < 0)
      request->request.wait();
    else
      request->request.wait(Clock::now() + std::chrono::milliseconds(timeout_ms));
  });
}

tandem_status_t tandem_request_source(const tandem_request_t* request, int* source) {
  static const char* fn = "tandem_request_source";
  return guard(fn, [&] {
    require_handle(request, fn, "request");
    require_handle(source, fn, "source");
    *source = request->request.source();
  });
}

void tandem_request_free(tandem_request_t* request) { delete request; }

// ---- gradient sync ----

void tandem_grad_sync_options_init(tandem_grad_sync_options_t* o) {
  if (!o) return;
  const fusion::GradientSyncOptions d;
  *o = tandem_grad_sync_options_t{};
  o->struct_size = sizeof *o;
  o->fusion_threshold_bytes = d.fusion.fusion_threshold_bytes;
  o->first_bucket_bytes = d.fusion.first_bucket_bytes;
  o->average = d.average ? 1 : 0;
  o->aggregation_frequency = d.aggregation_frequency;
  o->average_aggregated_gradients = d.average_aggregated_gradients ? 1 : 0;
  o->allow_unused = d.allow_unused ? 1 : 0;
  o->metric_slots = d.metric_slots;
}

tandem_status_t tandem_grad_sync_create(tandem_comm_t* comm, const tandem_grad_sync_options_t* options,
                                        tandem_grad_sync_t** sync) {
  static const char* fn = "tandem_grad_sync_create";
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    require_handle(sync, fn, "sync");
    const tandem_grad_sync_options_t o = with_defaults(options, tandem_grad_sync_options_init);
    fusion::GradientSyncOptions so;
    so.fusion.fusion_threshold_bytes = o.fusion_threshold_bytes;
    so.fusion.first_bucket_bytes = o.first_bucket_bytes;
    so.average = o.average != 0;
    so.aggregation_frequency = o.aggregation_frequency;
    so.average_aggregated_gradients = o.average_aggregated_gradients != 0;
    so.allow_unused = o.allow_unused != 0;
    so.metric_slots = o.metric_slots;
    auto s = std::make_unique<tandem_grad_sync>();
    s->owner = comm;
    s->metric_slots = o.metric_slots;
    s->sync = std::make_unique<fusion::GradientSync>(*comm->comm, so);
    *sync = s.release();
  });
}

tandem_status_t tandem_grad_sync_register(tandem_grad_sync_t* sync, const char* name, size_t count,
                                          tandem_dtype_t dtype, int* id) {
  static const char* fn = "tandem_grad_sync_register";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    require_handle(name, fn, "name");
    require_handle(id, fn, "id");
    *id = sync->sync->register_gradient(name, count, dtype_of(dtype, fn));
  });
}

tandem_status_t tandem_grad_sync_register_external(tandem_grad_sync_t* sync, const char* name, void* data, size_t count,
                                                   tandem_dtype_t dtype, int* id) {
  static const char* fn = "tandem_grad_sync_register_external";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    require_handle(name, fn, "name");
    require_handle(id, fn, "id");
    require(data != nullptr || count == 0, fn, "data is NULL for " + std::to_string(count) + " elements");
    *id = sync->sync->register_external(name, data, count, dtype_of(dtype, fn));
  });
}

tandem_status_t tandem_grad_sync_finalize(tandem_grad_sync_t* sync, int64_t timeout_ms) {
  static const char* fn = "tandem_grad_sync_finalize";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    sync->sync->finalize(deadline_in(*sync->owner->comm, timeout_ms));
  });
}

tandem_status_t tandem_grad_sync_data(tandem_grad_sync_t* sync, int id, void** data) {
  static const char* fn = "tandem_grad_sync_data";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    require_handle(data, fn, "data");
    *data = sync->sync->data(id);
  });
}

void tandem_grad_sync_mark_ready(tandem_grad_sync_t* sync, int id) {
  if (sync) sync->sync->mark_ready(id);
}

tandem_status_t tandem_grad_sync_report_metrics(tandem_grad_sync_t* sync, const tandem_metric_t* metrics, size_t n) {
  static const char* fn = "tandem_grad_sync_report_metrics";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    require(metrics != nullptr || n == 0, fn, "metrics is NULL");
    static_assert(sizeof(tandem_metric_t) == sizeof(fusion::Metric), "tandem_metric_t mirrors fusion::Metric");
    sync->sync->report_metrics({reinterpret_cast<const fusion::Metric*>(metrics), n});
  });
}

tandem_status_t tandem_grad_sync_metrics(const tandem_grad_sync_t* sync, tandem_metric_t* metrics, size_t n) {
  static const char* fn = "tandem_grad_sync_metrics";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    require_handle(metrics, fn, "metrics");
    require(n == size_t(sync->metric_slots), fn,
            "n is " + std::to_string(n) + " but the sync has " + std::to_string(sync->metric_slots) + " metric slots");
    const auto m = sync->sync->metrics();
    for (size_t i = 0; i < n && i < m.size(); ++i) metrics[i] = {m[i].sum, m[i].count};
  });
}

tandem_status_t tandem_grad_sync_wait(tandem_grad_sync_t* sync, int64_t timeout_ms) {
  static const char* fn = "tandem_grad_sync_wait";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    sync->sync->wait(deadline_in(*sync->owner->comm, timeout_ms));
  });
}

tandem_status_t tandem_grad_sync_zero(tandem_grad_sync_t* sync) {
  static const char* fn = "tandem_grad_sync_zero";
  return guard(fn, [&] {
    require_handle(sync, fn, "sync");
    sync->sync->zero_gradients();
  });
}

void tandem_grad_sync_destroy(tandem_grad_sync_t* sync) { delete sync; }

}  // extern "C"
