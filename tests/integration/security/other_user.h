// other_user.h: an attacker process running as another unprivileged user.
// It is forked before the victim exists (so it inherits no vmmc state and no
// threads), drops to nobody's uid and gid, and talks to the test over a
// socketpair in lines: the test hands it addresses and says when to act; it
// ends with a report, empty when nothing it tried got through.
#pragma once

#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>

namespace vmmc::test {

// One end of the line channel between the test and its attacker.
class line_channel {
 public:
  explicit line_channel(int fd = -1) : fd_(fd) {}
  bool send(const std::string& line) const {
    std::string s = line + "\n";
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // The next line, or "" on EOF or after `timeout_ms`.
  std::string receive(int timeout_ms = 10000) {
    for (;;) {
      if (auto at = buffer_.find('\n'); at != std::string::npos) {
        std::string line = buffer_.substr(0, at);
        buffer_.erase(0, at + 1);
        return line;
      }
      pollfd p{fd_, POLLIN, 0};
      char bytes[4096];
      ssize_t r = ::poll(&p, 1, timeout_ms) == 1 ? ::read(fd_, bytes, sizeof bytes) : -1;
      if (r <= 0) return {};
      buffer_.append(bytes, static_cast<std::size_t>(r));
    }
  }
  int fd() const { return fd_; }

 private:
  int fd_;
  std::string buffer_;
};

class other_user_process {
 public:
  static constexpr uid_t nobody = 65534;
  // Only root can become another user; tests skip with this reason otherwise.
  static bool possible() { return ::geteuid() == 0; }

  // Forks; the child becomes nobody, runs `attack` and sends back its report.
  explicit other_user_process(std::function<std::string(line_channel&)> attack) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(pair[0]);
      line_channel to_test(pair[1]);
      if (::setgroups(0, nullptr) != 0 || ::setresgid(nobody, nobody, nobody) != 0 ||
          ::setresuid(nobody, nobody, nobody) != 0) {
        to_test.send("could not become nobody");
        ::_exit(1);
      }
      std::string report = attack(to_test);
      to_test.send("report:" + report);
      ::_exit(0);
    }
    ::close(pair[1]);
    test_ = line_channel(pair[0]);
  }
  ~other_user_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(test_.fd());
  }
  line_channel& link() { return test_; }

  // The attacker's report ("" = nothing got through), or why there is none.
  std::string finish(int timeout_ms = 20000) {
    std::string line;
    do line = test_.receive(timeout_ms);
    while (!line.empty() && line.rfind("report:", 0) != 0);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    if (line.empty())
      return "the attacker ended without a report (status " + std::to_string(status) + ")";
    return line.substr(7);
  }

 private:
  pid_t pid_ = -1;
  line_channel test_;
};

}  // namespace vmmc::test
