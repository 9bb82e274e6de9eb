// preload/src/calls.h: the table of wrapped calls, shared by the interposer
// (preload.cc, loaded with every program) and its engine (engine.cc, loaded
// with the sockets layer once the process meets a TCP socket). The
// interposer fills one with libc's calls (the next definitions, RTLD_NEXT)
// and hands it to the engine, which gives back one with its own.
#pragma once

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

struct vmmc_preload_calls {
#define VMMC_REAL(ret, name, ...) ret (*name)(__VA_ARGS__);
#include "calls.def"
#undef VMMC_REAL
  // The engine's only: a line describing a descriptor it manages (-1 if none).
  int (*describe)(int fd, char* out, size_t length);
};

// The engine's one entry point: takes the calls it passes on to (the
// interposer's `next`, kept for the process's life), installs the sockets
// layer, and returns its own calls.
extern "C" const vmmc_preload_calls* vmmc_preload_engine(const vmmc_preload_calls* next);
