// vrpc/preload/preload.cc: libvrpc_preload.so as loaded with every program.
// It wraps clnt_vc_create, where every connection-oriented libtirpc client
// ends (engine.cc), and the descriptor-creating calls, and passes each on
// (RTLD_NEXT: libtirpc's, libc's) until the program makes such a client.
// Then it loads its engine (beside it), which brings vRPC and the sockets
// layer, and passes every call to the engine from then on. A program that
// makes no RPC client (a shell, /bin/true under vmmc-run --rpc) loads
// nothing else of ours: no C++ runtime, no libtirpc (2.0 ms per exec with
// them loaded at start, against 0.6). Linked as C (see preload.cc of
// libvmmc_preload).
#include <pthread.h>

#include "calls.h"
#include "engine_loader.h"

namespace {

vrpc_preload_calls next{};
pthread_once_t next_once = PTHREAD_ONCE_INIT;
bool next_resolved = false;

void resolve() {
  next.clnt_vc_create =
      reinterpret_cast<decltype(next.clnt_vc_create)>(::dlsym(RTLD_NEXT, "clnt_vc_create"));
  next.socket = reinterpret_cast<decltype(next.socket)>(::dlsym(RTLD_NEXT, "socket"));
  next.socketpair = reinterpret_cast<decltype(next.socketpair)>(::dlsym(RTLD_NEXT, "socketpair"));
  next.accept = reinterpret_cast<decltype(next.accept)>(::dlsym(RTLD_NEXT, "accept"));
  next.accept4 = reinterpret_cast<decltype(next.accept4)>(::dlsym(RTLD_NEXT, "accept4"));
  next.epoll_create =
      reinterpret_cast<decltype(next.epoll_create)>(::dlsym(RTLD_NEXT, "epoll_create"));
  next.epoll_create1 =
      reinterpret_cast<decltype(next.epoll_create1)>(::dlsym(RTLD_NEXT, "epoll_create1"));
  __atomic_store_n(&next_resolved, true, __ATOMIC_RELEASE);
}

inline const vrpc_preload_calls& passed_on() {
  if (__builtin_expect(!__atomic_load_n(&next_resolved, __ATOMIC_ACQUIRE), 0))
    ::pthread_once(&next_once, resolve);
  return next;
}

// Resolved at start: socket(), accept() and socketpair() may be called from
// a signal handler, and dlsym may not.
__attribute__((constructor)) void start() {
  (void)passed_on();
}

const vrpc_preload_calls* engine = nullptr;
pthread_once_t engine_once = PTHREAD_ONCE_INIT;

inline const vrpc_preload_calls* loaded() {
  return __atomic_load_n(&engine, __ATOMIC_ACQUIRE);
}

void load_engine() {
  (void)passed_on();
  using entry_point = const vrpc_preload_calls* (*)(const vrpc_preload_calls*);
  if (auto entry = reinterpret_cast<entry_point>(vmmc::preload::engine_entry(
          reinterpret_cast<void*>(&load_engine), "libvrpc_preload_engine.so", "vrpc_preload_engine",
          "vrpc-preload")))
    __atomic_store_n(&engine, entry(&next), __ATOMIC_RELEASE);
}

void load_engine_roomily() {
  vmmc::preload::on_roomy_stack(load_engine);
}

}  // namespace

#define PASS(name, ...)                                                    \
  if (const vrpc_preload_calls* e = loaded()) return e->name(__VA_ARGS__); \
  return passed_on().name(__VA_ARGS__);

extern "C" {

CLIENT* clnt_vc_create(int fd, const netbuf* raddr, rpcprog_t prog, rpcvers_t vers, u_int sendsz,
                       u_int recvsz) {
  ::pthread_once(&engine_once, load_engine_roomily);
  PASS(clnt_vc_create, fd, raddr, prog, vers, sendsz, recvsz);
}
int socket(int domain, int type, int protocol) {
  PASS(socket, domain, type, protocol);
}
int socketpair(int domain, int type, int protocol, int fds[2]) {
  PASS(socketpair, domain, type, protocol, fds);
}
int accept(int fd, sockaddr* address, socklen_t* length) {
  PASS(accept, fd, address, length);
}
int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  PASS(accept4, fd, address, length, flags);
}
int epoll_create(int size) {
  PASS(epoll_create, size);
}
int epoll_create1(int flags) {
  PASS(epoll_create1, flags);
}

}  // extern "C"
