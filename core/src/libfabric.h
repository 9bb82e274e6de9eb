// libfabric, loaded when a context first opens a provider rather than when a
// program loads the stack. Debian's libfabric brings every provider's
// libraries with it: libinfinipath calibrates its clock for ~0.2 s and
// installs crash handlers at load. A preloaded program that never meets a peer
// must neither pay for that nor behave differently.
#pragma once

#include <rdma/fabric.h>

#include <memory>

namespace vmmc::core::detail::libfabric {

// The library's few exported functions the stack calls; everything else in
// libfabric's API is inline and goes through the objects these return.
struct entry_points {
  decltype(&::fi_getinfo) getinfo;
  decltype(&::fi_freeinfo) freeinfo;
  decltype(&::fi_dupinfo) dupinfo;
  decltype(&::fi_fabric) fabric;
  decltype(&::fi_strerror) strerror;
};

// Loads the library once per process; null (and logged why) if it cannot.
const entry_points* load() noexcept;

// While alive, nothing libfabric or a provider does changes how the process
// handles signals: dispositions changed meanwhile are put back on destruction.
class signal_dispositions_kept {
 public:
  signal_dispositions_kept();
  ~signal_dispositions_kept();
  signal_dispositions_kept(const signal_dispositions_kept&) = delete;
  signal_dispositions_kept& operator=(const signal_dispositions_kept&) = delete;

 private:
  struct saved;
  std::unique_ptr<saved> saved_;
};

}  // namespace vmmc::core::detail::libfabric
