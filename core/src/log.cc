// What every part of core uses: the log and unique_fd (core.h).
#include <unistd.h>

#include <cstdarg>
#include <cstdio>

#include "core.h"

namespace vmmc::core::detail {

void log(int level, const char* format, ...) {
  static const int threshold = static_cast<int>(setting_integer(settings::log_level));
  if (level > threshold) return;
  std::va_list args;
  va_start(args, format);
  char line[512];
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::fprintf(stderr, "vmmc[%d]: %s\n", static_cast<int>(::getpid()), line);
}

void unique_fd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

}  // namespace vmmc::core::detail
