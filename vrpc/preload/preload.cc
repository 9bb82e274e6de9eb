// vrpc/preload/preload.cc: libvrpc_preload.so, which upgrades an unmodified,
// already-built libtirpc client to vRPC at run time (LD_PRELOAD).
//
// It interposes the calls that create connection-oriented clients by host or
// address (clnt_create and clnt_tp_create for a "tcp" transport, clnttcp_create
// without a socket) and tries clnt_vmmc_create first: rpcbind gives the
// program's TCP port as usual, vmmc::sockets offers VMMC in-band on the
// connection, and when the server accepts, the application gets a vRPC CLIENT.
// When it does not (a plain libtirpc server, or no answer to procedure 0
// within VMMC_VRPC_PRELOAD_WAIT_MS, default 2000) the connection is closed and the real libtirpc
// function makes the client, so nothing changes for plain servers. Clients
// made on a socket the application supplies stay libtirpc's.
//
// Like rdma-core's preload: the real functions are found once with
// dlsym(RTLD_NEXT), a thread-local flag passes calls made while we work
// (libtirpc's own rpcbind lookups) straight through, and all behaviour lives
// in the library below.
#include <dlfcn.h>
#include <netconfig.h>
#include <rpc/rpc.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "vmmc/sockets/socket.h"
#include "vmmc/vrpc/vrpc.h"

namespace {

thread_local bool busy = false;

struct guard {
  guard() { busy = true; }
  ~guard() { busy = false; }
};

template <class F>
F real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

bool circuit(const char* nettype) {
  return nettype && (std::strcmp(nettype, "tcp") == 0 || std::strcmp(nettype, "circuit_v") == 0 ||
                     std::strcmp(nettype, "circuit_n") == 0);
}

int wait_ms() {
  const char* text = std::getenv("VMMC_VRPC_PRELOAD_WAIT_MS");
  return text ? std::max(1, std::atoi(text)) : 2000;
}

// Keeps `client` if its connection was upgraded to VMMC, else destroys it
// and returns null (the caller falls back to libtirpc). Calls of procedure 0
// (which every program answers, by convention without side effects) drive
// the in-band negotiation: the first one's reply tells a VMMC server from a
// plain one, and after the second both directions have switched on both ends.
CLIENT* keep_if_upgraded(CLIENT* client) {
  if (!client) return nullptr;
  int fd = -1;
  clnt_control(client, CLGET_FD, &fd);
  const int ms = wait_ms();
  const timeval timeout{ms / 1000, (ms % 1000) * 1000};
  auto void_proc = reinterpret_cast<xdrproc_t>(reinterpret_cast<void*>(&xdr_void));
  for (int i = 0; i < 3; ++i) {
    clnt_stat s = clnt_call(client, NULLPROC, void_proc, nullptr, void_proc, nullptr, timeout);
    if (s == RPC_CANTSEND || s == RPC_CANTRECV || s == RPC_TIMEDOUT) break;
    auto info = vmmc::sockets::describe(fd);
    if (info && info->accelerated) return client;
    if (!info || info->plain) break;
  }
  clnt_destroy(client);
  return nullptr;
}

}  // namespace

extern "C" {

CLIENT* clnt_create(const char* host, rpcprog_t prog, rpcvers_t vers, const char* nettype) {
  static auto next =
      real<CLIENT* (*)(const char*, rpcprog_t, rpcvers_t, const char*)>("clnt_create");
  if (!busy && circuit(nettype)) {
    guard g;
    if (CLIENT* c = keep_if_upgraded(clnt_vmmc_create(host, prog, vers, 0))) return c;
  }
  return next(host, prog, vers, nettype);
}

CLIENT* clnt_tp_create(const char* host, rpcprog_t prog, rpcvers_t vers,
                       const struct netconfig* nconf) {
  static auto next =
      real<CLIENT* (*)(const char*, rpcprog_t, rpcvers_t, const netconfig*)>("clnt_tp_create");
  if (!busy && nconf && nconf->nc_netid && std::strcmp(nconf->nc_netid, "tcp") == 0) {
    guard g;
    if (CLIENT* c = keep_if_upgraded(clnt_vmmc_create(host, prog, vers, 0))) return c;
  }
  return next(host, prog, vers, nconf);
}

CLIENT* clnttcp_create(struct sockaddr_in* address, u_long prog, u_long vers, int* sockp,
                       u_int sendsz, u_int recvsz) {
  static auto next =
      real<CLIENT* (*)(sockaddr_in*, u_long, u_long, int*, u_int, u_int)>("clnttcp_create");
  if (!busy && sockp && *sockp == RPC_ANYSOCK) {
    guard g;
    sockaddr_in target = *address;
    if (target.sin_port == 0)
      target.sin_port = htons(pmap_getport(&target, prog, vers, IPPROTO_TCP));
    if (target.sin_port != 0) {
      if (CLIENT* c = keep_if_upgraded(clnt_vmmc_create_addr(&target, static_cast<rpcprog_t>(prog),
                                                             static_cast<rpcvers_t>(vers)))) {
        clnt_control(c, CLGET_FD, sockp);
        address->sin_port = target.sin_port;
        return c;
      }
    }
  }
  return next(address, prog, vers, sockp, sendsz, recvsz);
}

// The calls by which libfabric opens descriptors for the stack: what it
// opens is close-on-exec (sockets::stack_cloexec()), so no child of the
// program inherits it. Every other call passes unchanged.
int socket(int domain, int type, int protocol) {
  static auto next = real<int (*)(int, int, int)>("socket");
  return next(domain, type | vmmc::sockets::stack_cloexec(), protocol);
}
int socketpair(int domain, int type, int protocol, int fds[2]) {
  static auto next = real<int (*)(int, int, int, int*)>("socketpair");
  return next(domain, type | vmmc::sockets::stack_cloexec(), protocol, fds);
}
int accept(int fd, sockaddr* address, socklen_t* length) {
  static auto next = real<int (*)(int, sockaddr*, socklen_t*, int)>("accept4");
  return next(fd, address, length, vmmc::sockets::stack_cloexec());
}
int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  static auto next = real<int (*)(int, sockaddr*, socklen_t*, int)>("accept4");
  return next(fd, address, length, flags | vmmc::sockets::stack_cloexec());
}
int epoll_create(int size) {
  static auto next = real<int (*)(int)>("epoll_create");
  if (vmmc::sockets::stack_cloexec()) return epoll_create1(EPOLL_CLOEXEC);
  return next(size);
}
int epoll_create1(int flags) {
  static auto next = real<int (*)(int)>("epoll_create1");
  return next(flags | vmmc::sockets::stack_cloexec());
}

}  // extern "C"
