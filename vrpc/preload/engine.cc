// vrpc/preload/engine.cc: the engine of libvrpc_preload.so, which upgrades
// an unmodified, already-built libtirpc client to vRPC at run time
// (LD_PRELOAD). The interposer (preload.cc) loads it at the program's first
// connection-oriented client.
//
// Every connection-oriented client libtirpc makes (clnt_create and its
// _timed/_vers variants, clnt_tp_create[_timed], clnt_tli_create,
// clnttcp_create, or clnt_vc_create called directly) ends in clnt_vc_create,
// which libtirpc calls through its PLT: that one call is interposed. By then
// libtirpc has done everything as it always does (rpcbind lookup, its own
// timeouts and errors, the socket with its options, a reserved port bound
// by the program): we only connect that socket through vmmc::sockets and
// return a vRPC CLIENT on it. It is upgraded in-band during the first call
// if the server speaks VMMC, and stays kernel TCP (with clnt_vc's behaviour)
// otherwise: no extra connection, no extra call, nothing in clnt_geterr.
// Sockets that are already connected, other families and rpcbind's own port
// go to libtirpc unchanged.
//
// Like rdma-core's preload: the real functions are the interposer's (found
// with dlsym(RTLD_NEXT)), and all behaviour lives in the library below.
#include <netinet/in.h>
#include <sys/epoll.h>

#include "calls.h"
#include "vmmc/sockets/socket.h"
#include "vmmc/vrpc/vrpc.h"

namespace {

vrpc_preload_calls real{};  // the calls we pass on to

constexpr std::uint16_t rpcbind_port = 111;

// An IPv4 server address other than rpcbind's (whose lookups gain nothing).
bool ours_to_take(const netbuf* raddr) {
  if (!raddr || !raddr->buf || raddr->len != sizeof(sockaddr_in)) return false;
  const auto* a = static_cast<const sockaddr_in*>(raddr->buf);
  return a->sin_family == AF_INET && ntohs(a->sin_port) != rpcbind_port;
}

}  // namespace

// Named as the calls they wrap; collected in the table at the end.
namespace wrap {

CLIENT* clnt_vc_create(int fd, const netbuf* raddr, rpcprog_t prog, rpcvers_t vers, u_int sendsz,
                       u_int recvsz) {
  if (ours_to_take(raddr) && vmmc::sockets::take_over(fd) == 0)
    return clnt_vmmc_vc_create(fd, raddr, prog, vers);
  return real.clnt_vc_create(fd, raddr, prog, vers, sendsz, recvsz);
}

// The calls by which libfabric opens descriptors for the stack: what it
// opens is close-on-exec (sockets::stack_cloexec()), so no child of the
// program inherits it. Every other call passes unchanged.
int socket(int domain, int type, int protocol) {
  return real.socket(domain, type | vmmc::sockets::stack_cloexec(), protocol);
}
int socketpair(int domain, int type, int protocol, int fds[2]) {
  return real.socketpair(domain, type | vmmc::sockets::stack_cloexec(), protocol, fds);
}
int accept(int fd, sockaddr* address, socklen_t* length) {
  return real.accept4(fd, address, length, vmmc::sockets::stack_cloexec());
}
int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  return real.accept4(fd, address, length, flags | vmmc::sockets::stack_cloexec());
}
int epoll_create(int size) {
  if (vmmc::sockets::stack_cloexec()) return real.epoll_create1(EPOLL_CLOEXEC);
  return real.epoll_create(size);
}
int epoll_create1(int flags) {
  return real.epoll_create1(flags | vmmc::sockets::stack_cloexec());
}

}  // namespace wrap

namespace {
constexpr vrpc_preload_calls table{wrap::clnt_vc_create, wrap::socket,  wrap::socketpair,
                                   wrap::accept,         wrap::accept4, wrap::epoll_create,
                                   wrap::epoll_create1};
}  // namespace

extern "C" const vrpc_preload_calls* vrpc_preload_engine(const vrpc_preload_calls* next) {
  real = *next;
  return &table;
}
