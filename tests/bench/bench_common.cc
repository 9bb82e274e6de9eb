// tests/bench/bench_common.cc: options, result tables, JSON, timing and the
// fork-based two-process runner shared by every vmmc-bench benchmark.
#include "bench_common.h"

#include <arpa/inet.h>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace vmmc::bench {

namespace {

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

}  // namespace

// ---------------------------------------------------------------- options

bool parse_options(int argc, char** argv, options& out, std::string& error) {
  out = options{};
  std::string provider = "shm";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string& into) {
      if (i + 1 >= argc) {
        error = std::string(arg) + " needs a value";
        return false;
      }
      into = argv[++i];
      return true;
    };
    if (arg == "--quick") {
      out.quick = true;
    } else if (arg == "--json") {
      if (!value(out.json_path)) return false;
    } else if (arg == "--provider") {
      if (!value(provider)) return false;
    } else if (!arg.empty() && arg[0] == '-') {
      error = "unknown option " + std::string(arg);
      return false;
    } else if (out.benchmark.empty()) {
      out.benchmark = arg;
    } else {
      error = "unexpected argument " + std::string(arg);
      return false;
    }
  }
  if (out.benchmark.empty()) {
    error = "no benchmark named";
    return false;
  }
  if (provider == "all") {
    out.providers = {"shm", "tcp"};
  } else if (provider == "shm" || provider == "tcp") {
    out.providers = {provider};
  } else {
    error = "unknown provider " + provider + " (shm, tcp or all)";
    return false;
  }
  return true;
}

void print_usage(std::ostream& os, std::string_view argv0) {
  os << "usage: " << argv0 << " <benchmark> [--quick] [--json PATH] [--provider shm|tcp|all]\n"
     << "  benchmark   core, sockets, vrpc, nx, startup, contention,\n"
     << "              multihost (root: simulated hosts)\n"
     << "  --quick     short sweep, whole run under 30 s\n"
     << "  --json PATH also write the results as JSON to PATH\n"
     << "  --provider  libfabric provider(s) to measure: shm (default), tcp (tcp;ofi_rxm), all\n";
}

std::string fabric_provider_name(const std::string& short_name) {
  if (short_name == "shm") return "shm";
  if (short_name == "tcp") return "tcp;ofi_rxm";
  throw std::invalid_argument("unknown provider " + short_name);
}

// ---------------------------------------------------------------- results

std::string_view metric_name(metric m) {
  switch (m) {
    case metric::latency_us:
      return "latency_us";
    case metric::bandwidth_GBps:
      return "bandwidth_GBps";
    case metric::overhead_us:
      return "overhead_us";
    case metric::rate_per_s:
      return "rate_per_s";
    case metric::resident_MB:
      return "resident_MB";
  }
  return "?";
}

bool higher_is_better(metric m) {
  return m == metric::bandwidth_GBps || m == metric::rate_per_s;
}

void add_rows(std::vector<result_row>& rows, const std::string& case_name, metric what,
              const std::vector<std::size_t>& sizes, const std::vector<double>& ours,
              const std::map<std::string, std::vector<double>>& references) {
  if (!ours.empty() && ours.size() != sizes.size())
    throw std::invalid_argument("add_rows: ours has the wrong length for " + case_name);
  for (const auto& [name, values] : references)
    if (values.size() != sizes.size())
      throw std::invalid_argument("add_rows: reference " + name + " has the wrong length");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    result_row row{case_name, sizes[i], what, ours.empty() ? not_measured : ours[i], {}};
    for (const auto& [name, values] : references) row.reference[name] = values[i];
    rows.push_back(std::move(row));
  }
}

double gain(metric what, double ours, double ref) {
  if (std::isnan(ours) || std::isnan(ref) || ours <= 0 || ref <= 0) return not_measured;
  return higher_is_better(what) ? ours / ref : ref / ours;
}

namespace {

std::string format_number(double v) {
  if (std::isnan(v)) return "-";
  std::ostringstream os;
  const double a = std::fabs(v);
  os << std::fixed << std::setprecision(a < 10 ? 3 : a < 1000 ? 2 : 1) << v;
  return os.str();
}

std::string format_gain(double g) {
  if (std::isnan(g)) return "-";
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << g << "x";
  return os.str();
}

}  // namespace

void print_table(std::ostream& os, const std::string& benchmark,
                 const std::vector<result_row>& rows) {
  os << "vmmc-bench " << benchmark << ": gain columns are > 1 when ours is better"
     << " (latency/overhead: ref/ours, bandwidth/rate: ours/ref); '-' = not measured\n";
  std::size_t begin = 0;
  while (begin < rows.size()) {
    const result_row& first = rows[begin];
    std::size_t end = begin;
    while (end < rows.size() && rows[end].case_name == first.case_name &&
           rows[end].what == first.what)
      ++end;
    std::vector<std::string> refs;  // union of names, in map order
    for (std::size_t i = begin; i < end; ++i)
      for (const auto& entry : rows[i].reference)
        if (std::find(refs.begin(), refs.end(), entry.first) == refs.end())
          refs.push_back(entry.first);

    std::vector<std::string> header = {"case", "size", "metric", "ours"};
    for (const auto& r : refs) header.push_back(r);
    for (const auto& r : refs)
      header.push_back(higher_is_better(first.what) ? "ours/" + r : r + "/ours");
    std::vector<std::vector<std::string>> cells;
    for (std::size_t i = begin; i < end; ++i) {
      const result_row& row = rows[i];
      std::vector<std::string> line = {row.case_name, format_size(row.size),
                                       std::string(metric_name(row.what)), format_number(row.ours)};
      auto ref_of = [&](const std::string& r) {
        auto it = row.reference.find(r);
        return it == row.reference.end() ? not_measured : it->second;
      };
      for (const auto& r : refs) line.push_back(format_number(ref_of(r)));
      for (const auto& r : refs) line.push_back(format_gain(gain(row.what, row.ours, ref_of(r))));
      cells.push_back(std::move(line));
    }
    std::vector<std::size_t> width(header.size());
    for (std::size_t c = 0; c < header.size(); ++c) {
      width[c] = header[c].size();
      for (const auto& line : cells) width[c] = std::max(width[c], line[c].size());
    }
    auto print_line = [&](const std::vector<std::string>& line) {
      for (std::size_t c = 0; c < line.size(); ++c) {
        // First three columns are labels (left-aligned), the rest numbers.
        if (c < 3)
          os << std::left << std::setw(static_cast<int>(width[c])) << line[c];
        else
          os << std::right << std::setw(static_cast<int>(width[c])) << line[c];
        os << (c + 1 < line.size() ? "  " : "\n");
      }
    };
    os << "\n";
    print_line(header);
    for (const auto& line : cells) print_line(line);
    begin = end;
  }
  os << std::flush;
}

namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

void write_json(const std::string& path, const std::string& benchmark,
                const std::vector<result_row>& rows) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot open " + path + " for writing");
  out << "{\"benchmark\": " << json_string(benchmark) << ", \"results\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const result_row& row = rows[i];
    out << (i ? ",\n  " : "\n  ") << "{\"case\": " << json_string(row.case_name)
        << ", \"size\": " << row.size << ", \"metric\": " << json_string(metric_name(row.what))
        << ", \"ours\": " << json_number(row.ours) << ", \"reference\": {";
    bool first = true;
    for (const auto& [name, value] : row.reference) {
      out << (first ? "" : ", ") << json_string(name) << ": " << json_number(value);
      first = false;
    }
    out << "}}";
  }
  out << "\n]}\n";
  out.close();
  if (!out) throw std::runtime_error("error writing " + path);
}

// ---------------------------------------------------------------- timing

double median(std::vector<double> values) {
  if (values.empty()) return not_measured;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double median_of(int repeats, const std::function<double()>& run) {
  std::vector<double> values;
  for (int i = 0; i < repeats; ++i) values.push_back(run());
  return median(std::move(values));
}

std::size_t iterations_for(double target_seconds, double probe_seconds,
                           std::size_t probe_iterations, std::size_t min_iterations,
                           std::size_t max_iterations) {
  const double per_iteration =
      std::max(probe_seconds, 1e-9) / static_cast<double>(probe_iterations);
  const double wanted = target_seconds / per_iteration;
  if (wanted <= static_cast<double>(min_iterations)) return min_iterations;
  if (wanted >= static_cast<double>(max_iterations)) return max_iterations;
  return static_cast<std::size_t>(wanted);
}

effort effort_for(bool quick, scope what) {
  if (what == scope::latency) return quick ? effort{0.01, 9} : effort{0.04, 15};
  return quick ? effort{0.02, 3} : effort{0.1, 5};
}

double other_runnable_processes() {
  constexpr int samples = 10;
  double total = 0;
  for (int i = 0; i < samples; ++i) {
    std::ifstream stat("/proc/stat");
    std::string key;
    long value = 0;
    while (stat >> key) {
      if (key == "procs_running" && stat >> value) break;
      stat.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    if (key != "procs_running") return 0;
    total += static_cast<double>(value - 1);  // minus ourselves, reading
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return total / samples;
}

// ---------------------------------------------------------------- sizes

namespace {

std::vector<std::size_t> powers_of_4(std::size_t from, std::size_t to) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = from; s <= to; s *= 4) sizes.push_back(s);
  return sizes;
}

}  // namespace

std::vector<std::size_t> latency_sizes(bool quick) {
  if (quick) return {8, 64, 1024, 16 * 1024, 128 * 1024};
  auto sizes = powers_of_4(4, 64 * 1024);
  sizes.push_back(128 * 1024);
  return sizes;
}

std::vector<std::size_t> bandwidth_sizes(bool quick) {
  if (quick) return {64, 4 * 1024, 64 * 1024, 1024 * 1024, 8 * 1024 * 1024};
  auto sizes = powers_of_4(4, 4 * 1024 * 1024);
  sizes.push_back(8 * 1024 * 1024);
  return sizes;
}

std::vector<std::size_t> overhead_sizes(bool quick) {
  if (quick) return {8, 64, 1024, 16 * 1024};
  return {8, 64, 256, 1024, 4 * 1024, 16 * 1024, 64 * 1024};
}

std::string format_size(std::size_t bytes) {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) == 0)
    return std::to_string(bytes / (1024 * 1024)) + "MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + "KiB";
  return std::to_string(bytes) + "B";
}

// ---------------------------------------------------------------- peer_link

peer_link::peer_link(int fd, std::chrono::milliseconds timeout) : fd_(fd), timeout_(timeout) {}

peer_link::~peer_link() {
  if (fd_ >= 0) ::close(fd_);
}

void peer_link::throw_size_mismatch(std::size_t got, std::size_t want) {
  throw std::runtime_error("peer_link: expected a " + std::to_string(want) + "-byte value, got " +
                           std::to_string(got) + " bytes");
}

void peer_link::write_all(const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("peer_link send");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void peer_link::read_all(void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  const auto deadline = bench_clock::now() + timeout_;
  while (size > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - bench_clock::now());
    if (left.count() <= 0) throw std::runtime_error("peer_link: timed out waiting for the peer");
    pollfd pfd{fd_, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw_errno("peer_link poll");
    }
    if (ready == 0) continue;  // the deadline check above throws
    const ssize_t n = ::recv(fd_, p, size, 0);
    if (n == 0) throw std::runtime_error("peer_link: the peer closed the link");
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("peer_link recv");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void peer_link::send(std::string_view bytes) {
  const auto length = static_cast<std::uint32_t>(bytes.size());
  write_all(&length, sizeof length);
  write_all(bytes.data(), bytes.size());
}

std::string peer_link::recv() {
  std::uint32_t length = 0;
  read_all(&length, sizeof length);
  std::string bytes(length, '\0');
  read_all(bytes.data(), length);
  return bytes;
}

void peer_link::barrier() {
  send("barrier");
  if (recv() != "barrier") throw std::runtime_error("peer_link: barrier out of step");
}

// ---------------------------------------------------------------- run_pair

pair_placement& placement() {
  static pair_placement where;
  return where;
}

sockaddr_in child_address(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, placement().child_address.c_str(), &a.sin_addr) != 1)
    throw std::runtime_error("not an IPv4 address: " + placement().child_address);
  return a;
}

void run_pair(const std::function<void(peer_link&)>& parent,
              const std::function<void(peer_link&)>& child, std::chrono::seconds child_timeout) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw_errno("socketpair");
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);  // the child must not repeat buffered output
  const pid_t parent_pid = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw_errno("fork");
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent_pid) ::_exit(3);  // the parent died before prctl
    int code = 0;
    try {
      placement().in_child = true;
      if (placement().enter_child_host) placement().enter_child_host();
      peer_link link(fds[1]);
      child(link);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vmmc-bench child: %s\n", e.what());
      code = 1;
    } catch (...) {
      std::fprintf(stderr, "vmmc-bench child: unknown exception\n");
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);  // skip atexit handlers and destructors of the parent's state
  }

  ::close(fds[1]);
  std::exception_ptr parent_error;
  {
    peer_link link(fds[0]);
    try {
      parent(link);
    } catch (...) {
      parent_error = std::current_exception();
    }
  }  // closing the link lets a child blocked in recv() see EOF and exit

  int wstatus = 0;
  const auto deadline =
      bench_clock::now() + (parent_error ? std::chrono::seconds(2) : child_timeout);
  bool timed_out = false;
  for (;;) {
    const pid_t r = ::waitpid(pid, &wstatus, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw_errno("waitpid");
    if (bench_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wstatus, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (parent_error) std::rethrow_exception(parent_error);
  if (timed_out) throw std::runtime_error("child process timed out and was killed");
  if (WIFSIGNALED(wstatus))
    throw std::runtime_error("child process died of signal " + std::to_string(WTERMSIG(wstatus)));
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)
    throw std::runtime_error("child process failed with exit code " +
                             std::to_string(WEXITSTATUS(wstatus)));
}

}  // namespace vmmc::bench
