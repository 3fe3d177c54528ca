// RAII owners of the ucp handles; ucs_status_t to TransportError (ucx_handles.hpp).
#include "transport/ucx/ucx_handles.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "transport/transport_error.hpp"

namespace geoloco::transport::ucx {

void check_ucs(ucs_status_t status, const std::string& what) {
  if (status == UCS_OK || status == UCS_INPROGRESS) return;
  throw TransportError(fmt::format("{}: {}", what, ucs_status_string(status)));
}

Config::Config() { check_ucs(ucp_config_read(nullptr, nullptr, &cfg_), "ucp_config_read"); }
Config::~Config() {
  if (cfg_) ucp_config_release(cfg_);
}

bool Config::set_default(const std::string& name, const std::string& value) {
  // The user's UCX_* environment wins over our defaults: it is the documented escape hatch.
  if (std::getenv(("UCX_" + name).c_str()) != nullptr) return false;
  check_ucs(ucp_config_modify(cfg_, name.c_str(), value.c_str()), fmt::format("ucp_config_modify {}={}", name, value));
  return true;
}

Context::Context(const Config& config) {
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 0;
  check_ucs(ucp_init(&p, config.get(), &ctx_), "ucp_init");
}
Context::~Context() {
  if (ctx_) ucp_cleanup(ctx_);
}

Worker::Worker(const Context& context) {
  ucp_worker_params_t p{};
  p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  p.thread_mode = UCS_THREAD_MODE_SINGLE;
  check_ucs(ucp_worker_create(context.get(), &p, &worker_), "ucp_worker_create");
  ucs_status_t st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
    check_ucs(st, "ucp_worker_get_efd");
  }
}
Worker::~Worker() {
  if (worker_) ucp_worker_destroy(worker_);
}

Listener::Listener(const Worker& worker, const std::string& host, int port, ucp_listener_conn_callback_t cb,
                   void* arg) {
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1)
    throw TransportError(fmt::format("listen address '{}' is not an IPv4 address", host));
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&sa);
  p.sockaddr.addrlen = sizeof(sa);
  p.conn_handler.cb = cb;
  p.conn_handler.arg = arg;
  check_ucs(ucp_listener_create(worker.get(), &p, &listener_), fmt::format("listen on {}:{}", host, port));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  ucs_status_t st = ucp_listener_query(listener_, &attr);
  if (st != UCS_OK) {
    ucp_listener_destroy(listener_);
    listener_ = nullptr;
    check_ucs(st, "ucp_listener_query");
  }
  port_ = ntohs(reinterpret_cast<const struct sockaddr_in*>(&attr.sockaddr)->sin_port);
}
Listener::~Listener() {
  if (listener_) ucp_listener_destroy(listener_);
}

void Endpoint::close(bool force) {
  if (closing_ || ep_ == nullptr) return;
  closing_ = true;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* req = ucp_ep_close_nbx(ep_, &p);
  if (UCS_PTR_IS_PTR(req)) close_req_ = req;
}

bool Endpoint::closed() {
  if (ep_ == nullptr) return true;
  if (!closing_) return false;
  if (close_req_ != nullptr) {
    if (ucp_request_check_status(close_req_) == UCS_INPROGRESS) return false;
    ucp_request_free(close_req_);
    close_req_ = nullptr;
  }
  return true;
}

Endpoint::~Endpoint() {
  if (ep_ == nullptr) return;
  if (!closing_) close(true);
  // Bounded: a close that never finishes must not hang shutdown.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!closed() && std::chrono::steady_clock::now() < deadline) ucp_worker_progress(worker_);
  if (close_req_ != nullptr) ucp_request_free(close_req_);
}

std::string sockaddr_to_string(const struct sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const struct sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const struct sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace geoloco::transport::ucx
