// tests/bench/bench_common.h: the harness every vmmc-bench benchmark shares.
//
// A benchmark measures "ours" (the VMMC stack) beside one or more references
// (raw libfabric, memcpy, kernel TCP ...) in the same run and reports rows of
// `result_row`: a human table on stdout and, with --json, a machine-readable
// file. Two-process experiments go through `run_pair`, which forks before
// either side touches libfabric and connects the two with a `peer_link`.
//
// Command line (the contract of every benchmark in this project):
//   vmmc-bench <name> [--quick] [--json PATH] [--provider shm|tcp|all]
//
// Errors in the harness are reported as exceptions (std::runtime_error): a
// benchmark is an edge program, and the first failure ends it with a message.
// Nothing here is thread-safe; a benchmark runs one measuring thread per process.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace vmmc::bench {

// ---------------------------------------------------------------- options

struct options {
  std::string benchmark;               // "core", "sockets", "vrpc", "nx", "contention" ...
  bool quick = false;                  // whole run in under 30 s
  std::string json_path;               // empty: no JSON file
  std::vector<std::string> providers;  // short names: "shm" and/or "tcp"
};

// Parses argv. Returns false and fills `error` on a malformed command line.
// --provider defaults to "shm"; "all" means {"shm", "tcp"}.
bool parse_options(int argc, char** argv, options& out, std::string& error);
void print_usage(std::ostream& os, std::string_view argv0);

// The libfabric provider string for a short name: "shm" -> "shm",
// "tcp" -> "tcp;ofi_rxm". Throws std::invalid_argument for other names.
std::string fabric_provider_name(const std::string& short_name);

// ---------------------------------------------------------------- results

enum class metric { latency_us, bandwidth_GBps, overhead_us, rate_per_s, resident_MB };

std::string_view metric_name(metric m);
// Bandwidth and rate: higher is better. Latency, overhead and memory: lower is better.
bool higher_is_better(metric m);

inline constexpr double not_measured = std::numeric_limits<double>::quiet_NaN();

struct result_row {
  std::string case_name;  // "case" in JSON, e.g. "shm/latency"
  std::size_t size = 0;   // bytes
  metric what = metric::latency_us;
  double ours = not_measured;               // NaN: not measured (table "-", JSON null)
  std::map<std::string, double> reference;  // reference name -> value
};

// Appends one row per entry of `sizes`. `ours` may be empty (all NaN);
// every vector in `references` must have sizes.size() entries.
void add_rows(std::vector<result_row>& rows, const std::string& case_name, metric what,
              const std::vector<std::size_t>& sizes, const std::vector<double>& ours,
              const std::map<std::string, std::vector<double>>& references);

// The ratio printed in the table: > 1 always means "ours is better"
// (ref/ours for latency and overhead, ours/ref for bandwidth). NaN if either
// side is missing.
double gain(metric what, double ours, double ref);

// Human table: rows grouped by (case, metric) in order of appearance; each
// group shows its own references and one gain column per reference.
void print_table(std::ostream& os, const std::string& benchmark,
                 const std::vector<result_row>& rows);

// Writes {"benchmark": NAME, "results": [{"case", "size", "metric", "ours",
// "reference": {...}}]}. NaN values are written as null. Throws on I/O error.
void write_json(const std::string& path, const std::string& benchmark,
                const std::vector<result_row>& rows);

// ---------------------------------------------------------------- timing

using bench_clock = std::chrono::steady_clock;

inline double seconds_between(bench_clock::time_point a, bench_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median of the values (the mean of the middle two for an even count).
// NaN for an empty vector.
double median(std::vector<double> values);

// Calls `run` `repeats` times and returns the median of what it returned.
double median_of(int repeats, const std::function<double()>& run);

// How many iterations fill `target_seconds`, given that `probe_iterations`
// took `probe_seconds`; clamped to [min_iterations, max_iterations].
std::size_t iterations_for(double target_seconds, double probe_seconds,
                           std::size_t probe_iterations, std::size_t min_iterations,
                           std::size_t max_iterations);

// What a pair benchmark measures: all its rows (its own benchmark), or only
// its small-message round trips (`vmmc-bench contention`, which repeats them
// under several CPU conditions and must stay within --quick's 30 s).
enum class scope { all, latency };

// How long one repeat of a measurement should last, and how many repeats.
// Round trips alone (scope::latency) are measured in more, shorter repeats:
// on a crowded machine a figure swings with the scheduler from one repeat to
// the next, and only many repeats, alternated, compare two sides fairly.
struct effort {
  double repeat_seconds;
  int repeats;
};
effort effort_for(bool quick, scope what = scope::all);

// Measures one size: `run(n)` performs n iterations and returns seconds. A
// probe of `probe_iterations` sizes the repeats to effort_for(quick); returns
// the median over repeats of value(seconds, iterations).
template <class Run, class Value>
double calibrated_median(bool quick, std::size_t probe_iterations, std::size_t max_iterations,
                         Run run, Value value) {
  const effort e = effort_for(quick);
  const double probe = run(probe_iterations);
  const std::size_t iterations =
      iterations_for(e.repeat_seconds, probe, probe_iterations, probe_iterations, max_iterations);
  return median_of(e.repeats, [&] { return value(run(iterations), iterations); });
}

// Runnable processes other than this one, averaged over ~100 ms of sampling
// /proc/stat. The experiments busy-poll one thread in each of two processes;
// on a two-core machine any other busy process makes them wait for time
// slices (ping-pong latencies of milliseconds), so main() warns when this is
// at least 1. Returns 0 if /proc/stat cannot be read.
double other_runnable_processes();

// ---------------------------------------------------------------- sizes

// Ping-pong latency: 4 B .. 128 KiB (powers of 4, then 128 KiB).
// Quick: 8, 64, 1K, 16K, 128K.
std::vector<std::size_t> latency_sizes(bool quick);
// Streaming bandwidth: 4 B .. 8 MiB (powers of 4, then 8 MiB).
// Quick: 64, 4K, 64K, 1M, 8M.
std::vector<std::size_t> bandwidth_sizes(bool quick);
// Per-call send overhead: 8 B, 64 B, 1 KiB, 16 KiB (full adds 256 B, 4 KiB, 64 KiB).
std::vector<std::size_t> overhead_sizes(bool quick);

// "64B", "4KiB", "1MiB" ...
std::string format_size(std::size_t bytes);

// ---------------------------------------------------------------- two processes

// A framed, bidirectional byte channel between the two processes of
// `run_pair` (an AF_UNIX socketpair): for exchanging addresses, keys, plans and
// results outside timed regions. Every receive waits at most `timeout`; a
// closed peer or a timeout throws std::runtime_error.
class peer_link {
 public:
  explicit peer_link(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~peer_link();
  peer_link(const peer_link&) = delete;
  peer_link& operator=(const peer_link&) = delete;

  void send(std::string_view bytes);
  std::string recv();

  // Trivially copyable values, sent as raw bytes (both ends are one binary).
  template <class T>
  void send_value(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    send(std::string_view(reinterpret_cast<const char*>(&value), sizeof value));
  }
  template <class T>
  T recv_value() {
    static_assert(std::is_trivially_copyable_v<T>);
    const std::string bytes = recv();
    if (bytes.size() != sizeof(T)) throw_size_mismatch(bytes.size(), sizeof(T));
    T value;
    std::memcpy(&value, bytes.data(), sizeof value);
    return value;
  }

  // Returns when both processes have called barrier().
  void barrier();

 private:
  [[noreturn]] static void throw_size_mismatch(std::size_t got, std::size_t want);
  void write_all(const void* data, std::size_t size);
  void read_all(void* data, std::size_t size);

  int fd_;
  std::chrono::milliseconds timeout_;
};

// Where run_pair's two processes run. By default both on this host, the
// child listening on 127.0.0.1. `vmmc-bench multihost` puts the child on
// another simulated host (enter_child_host runs in it first) that listens on
// that host's address, so every pair benchmark measures across hosts as is.
struct pair_placement {
  std::string child_address = "127.0.0.1";   // where the child listens, the parent connects
  std::string parent_address = "127.0.0.1";  // the parent's own host's address
  std::function<void()> enter_child_host;    // empty: the child stays here
  bool in_child = false;                     // set in run_pair's child
};
pair_placement& placement();
// The address of the host this process runs on (a fabric listens there).
inline const std::string& this_host_address() {
  return placement().in_child ? placement().child_address : placement().parent_address;
}
// placement().child_address as a socket address with `port`.
sockaddr_in child_address(std::uint16_t port);

// Forks (before either side initialises libfabric: call it with no fabric
// objects open), runs `parent` here and `child` in the new process, each with
// its end of a peer_link. Results are measured in the parent; the child sends
// its numbers back through the link if needed. Waits for the child at most
// `child_timeout` after `parent` returns, then kills it. Throws if `parent`
// threw (after reaping the child), or if the child threw, crashed or timed out.
// The child dies with the parent (PR_SET_PDEATHSIG).
void run_pair(const std::function<void(peer_link&)>& parent,
              const std::function<void(peer_link&)>& child,
              std::chrono::seconds child_timeout = std::chrono::seconds(60));

}  // namespace vmmc::bench
