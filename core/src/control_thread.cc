// control_thread: starting, waking and ending a context's control thread.
#include "control_thread.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "fabric.h"

namespace vmmc::core::detail {

status control_thread::open() {
  wakeup_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  return wakeup_ ? status{} : status{errc::system_error};
}

void control_thread::start(std::function<void()> loop) {
  thread_ = std::thread([loop = std::move(loop)] {
    ::pthread_setname_np(::pthread_self(), "vmmc-control");
    one_of_the_stacks_threads();
    loop();
  });
}

void control_thread::wake() noexcept {
  std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakeup_.get(), &one, sizeof one);
}

void control_thread::take_wakeups() noexcept {
  std::uint64_t drained;
  [[maybe_unused]] ssize_t n = ::read(wakeup_.get(), &drained, sizeof drained);
}

void control_thread::stop() {
  stopping_.store(true, std::memory_order_release);
  wake();
  if (thread_.joinable()) thread_.join();
}

}  // namespace vmmc::core::detail
