// preload/src/engine_loader.h: how an interposer module (libvmmc_preload,
// libvrpc_preload) loads its engine once the process needs it: the shared
// object of that name in the module's own directory (the build tree and an
// installation alike), through its one entry point. C only: the modules
// load no C++ runtime (preload.cc).
#pragma once

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace vmmc::preload {

// The address of `entry` in `file`, loaded from the directory of the module
// that holds `self`; null on failure, said once on stderr as `who`: the
// program then runs on libc, as without us.
inline void* engine_entry(const void* self, const char* file, const char* entry, const char* who) {
  Dl_info module{};
  char path[4096];
  const char* error = "cannot find the module's path";
  if (::dladdr(self, &module) && module.dli_fname) {
    const char* slash = ::strrchr(module.dli_fname, '/');
    const int directory = slash ? static_cast<int>(slash - module.dli_fname + 1) : 0;
    const int n = ::snprintf(path, sizeof path, "%.*s%s", directory, module.dli_fname, file);
    error = "the engine's path is too long";
    if (n > 0 && static_cast<size_t>(n) < sizeof path) {
      void* handle = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
      void* found = handle ? ::dlsym(handle, entry) : nullptr;
      if (found) return found;
      error = ::dlerror();
    }
  }
  ::fprintf(stderr, "%s: engine not loaded (%s); calls go to libc\n", who, error);
  return nullptr;
}

// Runs `load` on this thread, or, where this thread's stack is small, on a
// thread of the default size and waits for it. Loading an engine runs the
// initialisers of its libraries, and programs give worker and RPC threads
// PTHREAD_STACK_MIN (16 KiB: ASan's initialisers overflowed it when such a
// thread made the process's first TCP socket).
inline void on_roomy_stack(void (*load)()) {
  constexpr size_t roomy = size_t{256} << 10;
  size_t size = 0;
  pthread_attr_t attributes;
  // The main thread's stack grows as needed (and asking for its size reads
  // /proc/self/maps).
  if (::getpid() != static_cast<pid_t>(::syscall(SYS_gettid)) &&
      ::pthread_getattr_np(::pthread_self(), &attributes) == 0) {
    ::pthread_attr_getstacksize(&attributes, &size);
    ::pthread_attr_destroy(&attributes);
  }
  pthread_t helper;
  if (size == 0 || size >= roomy ||
      ::pthread_create(
          &helper, nullptr,
          [](void* f) -> void* {
            reinterpret_cast<void (*)()>(f)();
            return nullptr;
          },
          reinterpret_cast<void*>(load)) != 0) {
    load();
    return;
  }
  ::pthread_join(helper, nullptr);
}

}  // namespace vmmc::preload
