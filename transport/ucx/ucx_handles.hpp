// RAII owners for the UCX (ucp) C handles. Every ucs_status_t is turned into a
// TransportError at this boundary, with the operation and peer in the message.
// All of these are used only on the Transport's progress thread (UCS_THREAD_MODE_SINGLE).
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <utility>

namespace geoloco::transport::ucx {

// Throws TransportError("<what>: <ucs status string>") unless status is UCS_OK (or
// UCS_INPROGRESS, which is not a failure). `what` carries the context.
void check_ucs(ucs_status_t status, const std::string& what);

// ucp_config_t from ucp_config_read plus geoloco's defaults (see ucx_env.hpp).
class Config {
 public:
  Config();
  ~Config();
  Config(const Config&) = delete;
  Config& operator=(const Config&) = delete;
  // Sets NAME (without the UCX_ prefix) unless the user's environment sets UCX_<NAME>;
  // returns whether it was applied.
  bool set_default(const std::string& name, const std::string& value);
  ucp_config_t* get() const { return cfg_; }

 private:
  ucp_config_t* cfg_ = nullptr;
};

class Context {
 public:
  explicit Context(const Config& config);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const { return ctx_; }

 private:
  ucp_context_h ctx_ = nullptr;
};

class Worker {
 public:
  explicit Worker(const Context& context);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ucp_worker_h get() const { return worker_; }
  int event_fd() const { return efd_; }

 private:
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
};

class Listener {
 public:
  // Binds host:port (port 0 picks a free one; port() reads back the bound port).
  Listener(const Worker& worker, const std::string& host, int port, ucp_listener_conn_callback_t cb, void* arg);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  int port() const { return port_; }
  ucp_listener_h get() const { return listener_; }

 private:
  ucp_listener_h listener_ = nullptr;
  int port_ = 0;
};

// An endpoint. Closing needs worker progress, so the owner calls close() and keeps
// progressing until closed() — the destructor falls back to a bounded force-close.
class Endpoint {
 public:
  Endpoint(ucp_worker_h worker, ucp_ep_h ep) : worker_(worker), ep_(ep) {}
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ucp_ep_h get() const { return ep_; }
  // Starts a close (force: cancel outstanding operations immediately). Idempotent.
  void close(bool force);
  // True once the close finished (or there was nothing to close).
  bool closed();

 private:
  ucp_worker_h worker_;
  ucp_ep_h ep_;
  void* close_req_ = nullptr;
  bool closing_ = false;
};

std::string sockaddr_to_string(const struct sockaddr_storage& ss);

}  // namespace geoloco::transport::ucx
