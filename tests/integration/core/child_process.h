// A forked child for tests that need a second process: it runs a function,
// can send lines to the parent, and is killed if still alive at destruction.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

namespace vmmc::test {

// State of a thread of this process from /proc ('R' running, 'S' sleeping ...).
inline char thread_state(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto at = text.rfind(") ");
  return at == std::string::npos ? '?' : text[at + 2];
}

class child_process {
 public:
  // `body` runs in the child and gets a write end for lines to the parent;
  // its return value is the child's exit code. The child exits after at most
  // `lifetime` even if body never returns (alarm), so nothing outlives a test.
  explicit child_process(std::function<int(int to_parent)> body,
                         std::chrono::seconds lifetime = std::chrono::seconds(60)) {
    int fds[2];
    if (::pipe(fds) != 0) std::abort();
#if defined(__SANITIZE_ADDRESS__)
    others_asleep();
#endif
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      ::alarm(static_cast<unsigned>(lifetime.count()));
      int code = body(fds[1]);
      ::_exit(code);
    }
    ::close(fds[1]);
    from_child_ = fds[0];
  }
  ~child_process() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(from_child_);
  }

  static void send_line(int fd, const std::string& line) {
    std::string l = line + "\n";
    [[maybe_unused]] ssize_t n = ::write(fd, l.data(), l.size());
  }

  // Reads one line from the child ("" on EOF).
  std::string read_line() {
    std::string line;
    char c;
    while (::read(from_child_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }

  pid_t pid() const {
    return pid_;
  }
  void kill_now() {
    ::kill(pid_, SIGKILL);
  }
  // Exit code, or 128 + signal.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
#if defined(__SANITIZE_ADDRESS__)
  // GCC 12's AddressSanitizer takes none of its allocator's locks around
  // fork(): a child forked while another thread holds one waits for it for
  // ever (CI: the child's own context's new thread, in
  // SizeClassAllocator64::GetFromAllocator, so the parent's import of the
  // child's buffer timed out). So the fork waits, up to 2 s, for every other
  // thread of ours to sleep (a context's threads sleep in poll when idle).
  static void others_asleep() {
    const pid_t self = ::gettid();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (;;) {
      bool all = true;
      for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
        const pid_t tid = std::stoi(task.path().filename().string());
        const char state = tid == self ? 'S' : thread_state(tid);
        if (state != 'S' && state != '?') all = false;  // '?': it ended meanwhile
      }
      if (all || std::chrono::steady_clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
#endif
  pid_t pid_ = -1;
  int from_child_ = -1;
  bool reaped_ = false;
};

}  // namespace vmmc::test
