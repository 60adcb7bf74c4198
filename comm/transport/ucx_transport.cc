#include "ucx_transport.h"

#include <poll.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "src/subsystem_log.h"
#include "tandem/errors.h"

namespace tandem {
namespace {

std::string status_text(ucs_status_t s) { return ucs_status_string(s); }

void check(ucs_status_t s, const char* what) {
  if (s != UCS_OK) throw Error(std::string("UCX ") + what + " failed: " + status_text(s));
}

}  // namespace

UcxTransport::UcxTransport(int rank, int size, bool peer_error_handling, const std::string& net_devices,
                           std::chrono::milliseconds keepalive)
    : rank_(rank), size_(size), peer_error_handling_(peer_error_handling), endpoints_(size, nullptr) {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");  // honours UCX_TLS and friends
  // Keepalive follows the heartbeat, so an unreachable peer shows up as an endpoint error as soon as the store would
  // name it. A keepalive of 0: none to set (off, or the user pinned UCX_KEEPALIVE_INTERVAL).
  if (peer_error_handling && keepalive.count() > 0) {
    const std::string interval = std::to_string(keepalive.count()) + "ms";
    if (ucp_config_modify(config, "KEEPALIVE_INTERVAL", interval.c_str()) != UCS_OK)
      subsystem_log(Subsystem::transport)
          .warn("tandem: UCX rejected KEEPALIVE_INTERVAL={}; keeping its default", interval);
  }
  if (!net_devices.empty()) {
    ucs_status_t s = ucp_config_modify(config, "NET_DEVICES", net_devices.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      throw InvalidArgument("UCX rejected network devices '" + net_devices + "': " + status_text(s));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // WAKEUP: long waits sleep on the worker's event fd instead of spinning.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.name = "tandem";
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(s, "ucp_init");

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // created on one thread, driven by the engine
  s = ucp_worker_create(context_, &wparams, &worker_);
  if (s != UCS_OK) {
    ucp_cleanup(context_);
    check(s, "ucp_worker_create");
  }

  s = ucp_worker_get_efd(worker_, &event_fd_);
  if (s != UCS_OK) {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    check(s, "ucp_worker_get_efd");
  }

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  check(ucp_worker_query(worker_, &attr), "ucp_worker_query");
  address_.assign(reinterpret_cast<const char*>(attr.address), attr.address_length);
  ucp_worker_release_address(worker_, attr.address);

  error_contexts_.resize(size);
  for (int p = 0; p < size; ++p) error_contexts_[p] = {this, p};
}

UcxTransport::~UcxTransport() {
  close_endpoints(Clock::now() + std::chrono::seconds(2));
  // After a peer failure UCX 1.13 can abort inside ucp_worker_destroy (an
  // assertion in its cross-memory-attach endpoint's cleanup while sends to the
  // dead peer are still queued; seen once in paramserver_test's killed
  // server). The worker and context are left to the process's exit then.
  if (failed_peer() >= 0) return;
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

void UcxTransport::sleep(std::chrono::microseconds timeout) {
  // Drain what is already there; arming is refused (BUSY) while events are pending.
  while (ucp_worker_progress(worker_) != 0) {
  }
  const ucs_status_t s = ucp_worker_arm(worker_);
  if (s == UCS_ERR_BUSY) return;
  check(s, "ucp_worker_arm");
  pollfd pfd{event_fd_, POLLIN, 0};
  const timespec ts{time_t(timeout.count() / 1000000), long(timeout.count() % 1000000) * 1000};
  if (ppoll(&pfd, 1, &ts, nullptr) < 0 && errno != EINTR) {
    throw Error(std::string("poll on the UCX event fd failed: ") + std::strerror(errno));
  }
}

void UcxTransport::wake() { ucp_worker_signal(worker_); }

void UcxTransport::on_endpoint_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* ctx = static_cast<ErrorContext*>(arg);
  int expected = -1;
  if (ctx->self->failed_peer_.compare_exchange_strong(expected, ctx->peer)) {
    ctx->self->failed_status_ = status;
    subsystem_log(Subsystem::transport)
        .debug("tandem: rank {} lost its UCX endpoint to rank {}: {}", ctx->self->rank_, ctx->peer,
               status_text(status));
  }
}

void UcxTransport::connect(int peer, const std::string& address) {
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = peer_error_handling_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &UcxTransport::on_endpoint_error;
  params.err_handler.arg = &error_contexts_[peer];
  check(ucp_ep_create(worker_, &params, &endpoints_[peer]), "ucp_ep_create");
}

Pending UcxTransport::send(int peer, Tag tag, const void* data, size_t bytes) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(1);
  ucs_status_ptr_t req = ucp_tag_send_nbx(endpoints_[peer], data, bytes, tag, &param);
  if (UCS_PTR_IS_ERR(req)) {
    throw PeerFailure(peer, "send to rank " + std::to_string(peer) + " failed: " + status_text(UCS_PTR_STATUS(req)));
  }
  Pending p(req, peer, bytes, false);
  if (req == nullptr) p.mark_done();  // completed in place
  return p;
}

Pending UcxTransport::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.datatype = ucp_dt_make_contig(1);
  // Tags carry no source, so every peer's messages match by the full tag; the
  // algorithms give each (step, segment) its own tag.
  ucs_status_ptr_t req = ucp_tag_recv_nbx(worker_, data, bytes, tag, mask, &param);
  if (UCS_PTR_IS_ERR(req)) {
    throw Error((peer >= 0 ? "receive from rank " + std::to_string(peer) : std::string("receive from any rank")) +
                " failed: " + status_text(UCS_PTR_STATUS(req)));
  }
  return Pending(req, peer, bytes, true);
}

bool UcxTransport::poll(Pending& p, Tag* sender_tag) {
  if (p.done()) return true;
  ucs_status_t s;
  size_t received = p.bytes();
  if (p.is_recv()) {
    ucp_tag_recv_info_t info{};
    s = ucp_tag_recv_request_test(p.handle(), &info);
    if (s == UCS_OK) received = info.length;
    if (s == UCS_OK && sender_tag) *sender_tag = info.sender_tag;
  } else {
    s = ucp_request_check_status(p.handle());
  }
  if (s == UCS_INPROGRESS) return false;
  ucp_request_free(p.handle());
  const int peer = p.peer();
  const size_t expected = p.bytes();
  p.mark_done();
  if (s == UCS_ERR_MESSAGE_TRUNCATED || (s == UCS_OK && received != expected)) {
    throw CollectiveMismatch("collective mismatch: rank " + std::to_string(rank_) + " expected a " +
                             std::to_string(expected) +
                             "-byte message but got a larger or smaller one; every rank "
                             "must call the same collectives in the same order with the same count and dtype");
  }
  if (s != UCS_OK) {
    int failed = failed_peer();
    int who = failed >= 0 ? failed : peer;
    throw PeerFailure(who, "rank " + std::to_string(who) + " failed: UCX reported " + status_text(s) +
                               " on a message with rank " + std::to_string(peer));
  }
  return true;
}

bool UcxTransport::probe(Tag tag, Tag mask) {
  ucp_tag_recv_info_t info{};
  return ucp_tag_probe_nb(worker_, tag, mask, 0, &info) != nullptr;
}

void UcxTransport::cancel(Pending& p) {
  if (p.done()) return;
  ucp_request_cancel(worker_, p.handle());
  ucp_request_free(p.handle());  // released by UCX once the cancellation completes
  p.mark_done();
  ucp_worker_progress(worker_);  // lets the cancellation complete
}

void UcxTransport::close_endpoints(Deadline deadline, bool force) {
  std::vector<void*> closing;
  for (auto& ep : endpoints_) {
    if (!ep) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // A dead peer cannot acknowledge a flush; force-close then.
    param.flags = force || failed_peer() >= 0 ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
    if (req && !UCS_PTR_IS_ERR(req)) closing.push_back(req);
    ep = nullptr;
  }
  while (!closing.empty()) {
    ucp_worker_progress(worker_);
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing[i]);
        closing[i] = closing.back();
        closing.pop_back();
      } else {
        ++i;
      }
    }
    if (Clock::now() > deadline) {
      for (void* r : closing) {
        ucp_request_cancel(worker_, r);
        ucp_request_free(r);
      }
      break;
    }
  }
}

bool UcxTransport::supports_cuda_memory() const {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &attr) != UCS_OK) return false;
  return attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA);
}

std::string UcxTransport::describe() const {
  std::set<std::string> transports;
  static const std::regex lane_tl(R"(\d+:([a-z0-9_]+/[A-Za-z0-9_:.\-]+?)(\.\d+)?\s)");
  for (int p = 0; p < size_; ++p) {
    if (!endpoints_[p] || p == rank_) continue;
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (!f) continue;
    ucp_ep_print_info(endpoints_[p], f);
    fclose(f);
    std::string text(buf, len);
    free(buf);
    for (std::sregex_iterator it(text.begin(), text.end(), lane_tl), end; it != end; ++it) {
      transports.insert((*it)[1]);
    }
  }
  std::ostringstream out;
  for (const auto& t : transports) out << (out.tellp() > 0 ? " " : "") << t;
  return out.str();
}

}  // namespace tandem
