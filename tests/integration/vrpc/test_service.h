// tests/integration/vrpc/test_service.h: a small RPC program for the vrpc
// tests and benchmark, written against libtirpc's C API as rpcgen output
// would be, a server that serves it over UDP, TCP and vRPC at once with one
// unmodified svc_run(), and that server as a child process of the test.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rpc/rpc.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "vmmc/sockets/socket.h"
#include "vmmc/vrpc/vrpc.h"

namespace vrpc_test {

constexpr rpcprog_t program = 0x20005555;
constexpr rpcvers_t version = 1;
enum procedure : rpcproc_t {
  proc_null = 0,
  proc_echo = 1,    // opaque<> -> the same opaque<>
  proc_whoami = 2,  // void -> string: "path=<p> flavor=<n> uid=<u> gid=<g> machine=<m> caller=<a>"
  proc_sleep = 3,   // u_int milliseconds -> void, after sleeping
  proc_oneway = 4,  // void -> no reply at all (batched/one-way calls)
  proc_count = 5,   // void -> u_int: one-way calls received so far
  proc_sink = 6,    // opaque<> -> u_int length
  proc_source = 7,  // u_int length -> opaque<> of that length
};

// opaque<> both ways: XDR decodes into `data` (allocated when null).
struct blob {
  u_int length = 0;
  char* data = nullptr;
};
inline bool_t xdr_blob(XDR* xdrs, blob* b) {
  return xdr_bytes(xdrs, &b->data, &b->length, ~0u);
}

// proc_sink decodes into one buffer of this size, as a service that owns its
// memory would (no allocation per call).
constexpr u_int sink_capacity = 64u << 20;
inline bool_t xdr_sink_blob(XDR* xdrs, blob* b) {
  return xdr_bytes(xdrs, &b->data, &b->length, sink_capacity);
}

template <class F>
xdrproc_t proc(F f) {
  return reinterpret_cast<xdrproc_t>(reinterpret_cast<void*>(f));
}

inline u_int oneway_calls = 0;

inline std::string describe_request(svc_req* request) {
  SVCXPRT* x = request->rq_xprt;
  const char* path = svc_vmmc_path(x);
  std::string text = std::string("path=") + (path ? path : x->xp_netid ? x->xp_netid : "?");
  text += " flavor=" + std::to_string(request->rq_cred.oa_flavor);
  if (request->rq_cred.oa_flavor == AUTH_SYS) {
    auto* creds = static_cast<authsys_parms*>(request->rq_clntcred);
    text += " uid=" + std::to_string(creds->aup_uid) + " gid=" + std::to_string(creds->aup_gid) +
            " machine=" + creds->aup_machname;
  }
  const auto* caller = reinterpret_cast<const sockaddr_in*>(svc_getcaller(x));
  char address[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &caller->sin_addr, address, sizeof address);
  text += std::string(" caller=") + address;
  netbuf* rpc_caller = svc_getrpccaller(x);
  text += " rpccaller_len=" + std::to_string(rpc_caller ? rpc_caller->len : 0);
  // TCP segments that woke this connection (vRPC connections only).
  if (auto info = vmmc::sockets::describe(x->xp_fd))
    text += " doorbells_in=" + std::to_string(info->doorbells_in);
  return text;
}

inline void dispatch(svc_req* request, SVCXPRT* xprt) {
  switch (request->rq_proc) {
    case proc_null:
      svc_sendreply(xprt, proc(xdr_void), nullptr);
      return;
    case proc_echo: {
      blob b;
      if (!svc_getargs(xprt, proc(xdr_blob), &b)) return svcerr_decode(xprt);
      svc_sendreply(xprt, proc(xdr_blob), &b);
      svc_freeargs(xprt, proc(xdr_blob), &b);
      return;
    }
    case proc_whoami: {
      std::string text = describe_request(request);
      char* p = text.data();
      svc_sendreply(xprt, proc(xdr_wrapstring), &p);
      return;
    }
    case proc_sleep: {
      u_int ms = 0;
      if (!svc_getargs(xprt, proc(xdr_u_int), &ms)) return svcerr_decode(xprt);
      usleep(ms * 1000);
      svc_sendreply(xprt, proc(xdr_void), nullptr);
      return;
    }
    case proc_oneway:
      ++oneway_calls;
      return;
    case proc_count:
      svc_sendreply(xprt, proc(xdr_u_int), &oneway_calls);
      return;
    case proc_sink: {
      static std::string space(sink_capacity, '\0');
      blob b{0, space.data()};
      if (!svc_getargs(xprt, proc(xdr_sink_blob), &b)) return svcerr_decode(xprt);
      u_int n = b.length;
      svc_sendreply(xprt, proc(xdr_u_int), &n);
      return;
    }
    case proc_source: {
      static std::string data;
      u_int n = 0;
      if (!svc_getargs(xprt, proc(xdr_u_int), &n)) return svcerr_decode(xprt);
      if (data.size() < n) data.assign(n, 'r');
      blob b{n, data.data()};
      svc_sendreply(xprt, proc(xdr_blob), &b);
      return;
    }
    default:
      svcerr_noproc(xprt);
  }
}

struct ports {
  unsigned short udp = 0, tcp = 0, vmmc = 0;
};

// A socket bound to `address` (network order), any port.
inline int bound_socket(int type, in_addr_t address) {
  int fd = socket(AF_INET, type, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = address;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  if (type == SOCK_STREAM) listen(fd, SOMAXCONN);
  return fd;
}

// Creates the three transports on `address` (network order; loopback by
// default) and registers `dispatch` on each; returns their ports (all 0 on
// failure). With `portmap`, the vRPC transport is registered with rpcbind as
// the program's TCP transport (and UDP as its UDP one). The caller then
// runs svc_run().
inline ports start_server(bool portmap, in_addr_t address = htonl(INADDR_LOOPBACK)) {
  SVCXPRT* udp = svcudp_create(bound_socket(SOCK_DGRAM, address));
  SVCXPRT* tcp = svctcp_create(bound_socket(SOCK_STREAM, address), 0, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = address;
  SVCXPRT* vmmc = svc_vmmc_create(&a);
  if (!udp || !tcp || !vmmc) return {};
  if (portmap) pmap_unset(program, version);
  if (!svc_register(udp, program, version, dispatch, portmap ? IPPROTO_UDP : 0) ||
      !svc_register(tcp, program, version, dispatch, 0) ||
      !svc_register(vmmc, program, version, dispatch, portmap ? IPPROTO_TCP : 0))
    return {};
  return {udp->xp_port, tcp->xp_port, vmmc->xp_port};
}

// The server process: start_server(), the ports written to `report_fd`,
// then svc_run() until killed; dies with its parent.
[[noreturn]] inline void serve(int report_fd, bool portmap = false) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  ports p = start_server(portmap);
  if (p.vmmc == 0) _exit(3);
  if (write(report_fd, &p, sizeof p) != sizeof p) _exit(5);
  close(report_fd);
  svc_run();
  _exit(6);
}

// A server child; killed when the fixture ends.
class server_process {
 public:
  server_process() {
    int fds[2];
    if (pipe(fds) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      serve(fds[1]);
    }
    close(fds[1]);
    if (read(fds[0], &ports_, sizeof ports_) != static_cast<ssize_t>(sizeof ports_)) ports_ = {};
    close(fds[0]);
  }
  ~server_process() { kill(); }
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;
  pid_t pid() const { return pid_; }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  const struct ports& port() const { return ports_; }
  sockaddr_in address(unsigned short port) const {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    return a;
  }

 private:
  pid_t pid_ = -1;
  struct ports ports_;
};

}  // namespace vrpc_test
