// What the C API's source files share: the handles behind the opaque types,
// the error mapping (C++ exceptions to a status and the thread-local message),
// argument checks and the enum and option conversions.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/c_api.h"
#include "tandem/tandem.h"

struct tandem_comm {
  std::unique_ptr<tandem::Communicator> comm;
};

struct tandem_request {
  tandem::Request request;
};

namespace tandem::capi {

// Records the message for tandem_last_error() on this thread; returns status.
tandem_status_t fail(tandem_status_t status, std::string message);

// Runs body, mapping tandem's error types to statuses.
template <typename Body>
tandem_status_t guard(const char* fn, Body&& body) noexcept {
  try {
    body();
    return TANDEM_OK;
  } catch (const InvalidArgument& e) {
    return fail(TANDEM_INVALID_ARGUMENT, e.what());
  } catch (const Timeout& e) {
    return fail(TANDEM_TIMEOUT, e.what());
  } catch (const PeerFailure& e) {
    return fail(TANDEM_PEER_FAILURE, e.what());
  } catch (const Excluded& e) {
    return fail(TANDEM_EXCLUDED, e.what());
  } catch (const Revoked& e) {
    return fail(TANDEM_REVOKED, e.what());
  } catch (const Aborted& e) {
    return fail(TANDEM_ABORTED, e.what());
  } catch (const std::exception& e) {
    return fail(TANDEM_INTERNAL, std::string(fn) + ": " + e.what());
  } catch (...) {
    return fail(TANDEM_INTERNAL, std::string(fn) + ": unknown error");
  }
}

// Argument checks throw InvalidArgument naming the function and the argument.
inline void require(bool ok, const char* fn, const std::string& what) {
  if (!ok) throw InvalidArgument(std::string(fn) + ": " + what);
}
template <typename T>
void require_handle(const T* p, const char* fn, const char* name) {
  require(p != nullptr, fn, std::string(name) + " is NULL");
}

inline DataType dtype_of(tandem_dtype_t d, const char* fn) {
  require(int(d) >= int(TANDEM_F32) && int(d) <= int(TANDEM_U8), fn,
          "dtype " + std::to_string(int(d)) + " is not a tandem_dtype_t");
  return DataType(int(d));  // the enums share their order
}
inline ReduceOp op_of(tandem_reduce_op_t op, const char* fn) {
  require(int(op) >= int(TANDEM_SUM) && int(op) <= int(TANDEM_PROD), fn,
          "op " + std::to_string(int(op)) + " is not a tandem_reduce_op_t");
  return ReduceOp(int(op));
}
inline CollectiveOptions collective(int64_t timeout_ms) {
  CollectiveOptions o;
  if (timeout_ms >= 0) o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

// A blocking call on a checked communicator.
template <typename Call>
tandem_status_t on_comm(const char* fn, tandem_comm_t* comm, Call&& call) {
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    call(*comm->comm);
  });
}

// The async forms share this: issue, then hand the request over.
template <typename Issue>
tandem_status_t issue_async(const char* fn, tandem_comm_t* comm, tandem_request_t** request, Issue&& issue) {
  return guard(fn, [&] {
    require_handle(comm, fn, "comm");
    require_handle(request, fn, "request");
    auto r = std::make_unique<tandem_request>();
    r->request = issue(*comm->comm);
    *request = r.release();
  });
}

// A group's messages from C; InvalidArgument naming a bad kind or dtype.
std::vector<P2POp> ops_of(const tandem_p2p_op_t* ops, size_t n, const char* fn);

// A communicator handle around a new C++ communicator (NULL for none: split's undefined colour).
inline tandem_comm_t* handle_of(std::unique_ptr<Communicator> c) {
  if (!c) return nullptr;
  auto h = std::make_unique<tandem_comm>();
  h->comm = std::move(c);
  return h.release();
}

}  // namespace tandem::capi
