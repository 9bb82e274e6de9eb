// tests/support/interposer.h: what the socket interposer says of a
// descriptor, for test programs run under LD_PRELOAD=libvmmc_preload.so.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <string>

namespace vmmc::test {

// "accelerated=1 ..." from the interposer (vmmc_preload_describe), or ""
// without it.
inline std::string describe_preloaded(int fd) {
  using fn = int (*)(int, char*, std::size_t);
  static auto f = reinterpret_cast<fn>(::dlsym(RTLD_DEFAULT, "vmmc_preload_describe"));
  char line[256] = "";
  if (!f || f(fd, line, sizeof line) < 0) return "";
  return line;
}

}  // namespace vmmc::test
