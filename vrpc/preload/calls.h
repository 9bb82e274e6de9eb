// vrpc/preload/calls.h: the calls libvrpc_preload wraps, as a table shared by
// the interposer (preload.cc, loaded with every program) and its engine
// (engine.cc, loaded with vRPC and the sockets layer at the program's first
// connection-oriented RPC client). The interposer fills one with the next
// definitions (RTLD_NEXT: libtirpc's, libc's) and hands it to the engine,
// which gives back one with its own.
#pragma once

#include <rpc/rpc.h>
#include <sys/socket.h>

struct vrpc_preload_calls {
  CLIENT* (*clnt_vc_create)(int, const netbuf*, rpcprog_t, rpcvers_t, u_int, u_int);
  int (*socket)(int, int, int);
  int (*socketpair)(int, int, int, int*);
  int (*accept)(int, sockaddr*, socklen_t*);
  int (*accept4)(int, sockaddr*, socklen_t*, int);
  int (*epoll_create)(int);
  int (*epoll_create1)(int);
};

// The engine's one entry point: takes the calls it passes on to (kept for
// the process's life) and returns its own.
extern "C" const vrpc_preload_calls* vrpc_preload_engine(const vrpc_preload_calls* next);
