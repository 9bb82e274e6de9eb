// libfabric, loaded on first use (see libfabric.h), with what its providers
// would change in the process kept out.
#include "libfabric.h"

#include <dlfcn.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

#include "core.h"
#include "environment.h"

namespace vmmc::core::detail::libfabric {

namespace {

template <typename F>
bool resolve(void* library, const char* name, F& function) {
  function = reinterpret_cast<F>(::dlsym(library, name));
  if (!function) VMMC_ERROR("%s has no %s", VMMC_LIBFABRIC_SONAME, name);
  return function != nullptr;
}

entry_points load_once() {
  // All are read once, by the first fi_getinfo or at load: libfabric 1.17's
  // tcp provider leaves Nagle on (64-byte ping-pongs then take milliseconds);
  // rxm, unless passed through to tcp's own reliable endpoints (we use RMA
  // only, which rxm forwards anyway), opens a shared receive context of 4096
  // 16 KiB buffers: 210 ms and 68 MB per context, against 5 ms and 1 MB
  // passed through, at the same latency; and libinfinipath, unless told not
  // to, turns SIGSEGV/BUS/ILL/ABRT/INT/TERM into exit(1) plus a *.btr file
  // and resets them with rt_sigaction at exit (which a seccomp-sandboxed
  // child may not call). The last must stay set until exit. A user's own
  // values win. (This runs at a context's first provider, maybe with the
  // program's own threads running: no setenv().)
  add_to_environment({"FI_TCP_NODELAY=1", "FI_OFI_RXM_ENABLE_PASSTHRU=1", "IPATH_NO_BACKTRACE=1"});

  signal_dispositions_kept kept;
  fabric_call call;  // descriptors a provider opens at load are close-on-exec
  entry_points e{};
  void* library = ::dlopen(VMMC_LIBFABRIC_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    VMMC_ERROR("cannot load %s: %s", VMMC_LIBFABRIC_SONAME, ::dlerror());
    return e;
  }
  // Never unloaded: providers keep threads and handlers until exit.
  if (!resolve(library, "fi_getinfo", e.getinfo) || !resolve(library, "fi_freeinfo", e.freeinfo) ||
      !resolve(library, "fi_dupinfo", e.dupinfo) || !resolve(library, "fi_fabric", e.fabric) ||
      !resolve(library, "fi_strerror", e.strerror))
    return entry_points{};
  return e;
}

}  // namespace

const entry_points* load() noexcept {
  static const entry_points loaded = load_once();
  return loaded.getinfo ? &loaded : nullptr;
}

// ---- signal_dispositions_kept ---------------------------------------------------
struct signal_dispositions_kept::saved {
  struct sigaction action[NSIG];
  bool known[NSIG];
};

namespace {
// Masks compared signal by signal: glibc copies the kernel's 8 bytes into a
// 128-byte sigset_t and leaves the rest as it found it.
bool same(const struct sigaction& a, const struct sigaction& b) {
  if (a.sa_sigaction != b.sa_sigaction || a.sa_flags != b.sa_flags) return false;
  for (int s = 1; s < NSIG; ++s)
    if (::sigismember(&a.sa_mask, s) != ::sigismember(&b.sa_mask, s)) return false;
  return true;
}
}  // namespace

signal_dispositions_kept::signal_dispositions_kept() : saved_(std::make_unique<saved>()) {
  for (int s = 1; s < NSIG; ++s)
    saved_->known[s] = ::sigaction(s, nullptr, &saved_->action[s]) == 0;
}

signal_dispositions_kept::~signal_dispositions_kept() {
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction now {};
    if (!saved_->known[s] || ::sigaction(s, nullptr, &now) != 0 || same(now, saved_->action[s]))
      continue;
    // Expected: the shm provider hooks SIGINT/BUS/SEGV/TERM to remove its files
    // (we remove stale ones at start instead).
    VMMC_DEBUG("libfabric changed the handling of signal %d (%s); put back", s, ::strsignal(s));
    ::sigaction(s, &saved_->action[s], nullptr);
  }
}

}  // namespace vmmc::core::detail::libfabric
