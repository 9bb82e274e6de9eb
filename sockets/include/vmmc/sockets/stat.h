// vmmc/sockets/stat.h: the live view of connections that vmmc-stat prints.
//
// Every process using the sockets layer (the interposer, vRPC, programs
// linked with it) publishes what it knows about its TCP connections in a
// small file of its own, <directory>/vmmc-<uid>/<pid> (the setting
// VMMC_SOCKETS_STAT_DIR, default /dev/shm; the per-user folder is mode 0700,
// the file 0600): one row per connection (addresses, path, why it stayed on
// kernel TCP, byte counters) and the process's UTLB counters. Rows change
// when a connection is made, decided or closed; the counters of accelerated
// connections are copied in by a thread of the process when a reader asks
// (a shared futex in the file), so the data path pays nothing. A process that
// never met a vmmc peer has no such thread: its rows are kernel TCP, whose
// counts the kernel keeps (vmmc-stat asks it through sock_diag).
//
// read_published() is the reading side, used by vmmc-stat.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vmmc::sockets {

// Why a connection is (or went back to) kernel TCP. Stable names for scripts.
enum class fallback : std::uint8_t {
  none,            // not fallen back
  disabled,        // VMMC_SOCKETS_ENABLE=0
  excluded,        // its port or peer address is outside VMMC_SOCKETS_PORTS / in _EXCLUDE
  peer_plain,      // the peer does not run vmmc (no presence entry, or an ordinary first byte)
  foreign_urgent,  // the peer's first byte was urgent, but not ours
  refused,         // upgrade refused: too many offers awaiting their client's hello
  no_context,      // this process could not create its VMMC context
  setup_failed,    // the redirect channel could not be set up
  offer_failed,    // the offer byte could not be sent
  protocol_error,  // the peer broke the upgrade protocol (the connection failed)
  reverted,        // went back to kernel TCP before fork() or exec()
  remote_no_rdma,  // peer on another host, no RDMA device: kernel TCP is as fast
  remote_tcp,      // peer on another host, VMMC_SOCKETS_REMOTE=tcp
  last_reason = remote_tcp,
};
// "peer_plain" ...; "?" for a value this build does not know.
std::string_view fallback_name(fallback reason) noexcept;
// A phrase for people: "peer does not run vmmc" ...
std::string_view fallback_text(fallback reason) noexcept;

// One connection as its process published it.
struct published_connection {
  int fd = -1;
  bool is_client = false;
  std::uint64_t inode = 0;    // the socket's inode (sock_diag's idiag_inode)
  std::string local, remote;  // "127.0.0.1:6379", "[::1]:6379"
  // "accelerated" (our writes on VMMC; the peer's switch at the byte count
  // its hello names), "upgrading", "undecided", "connecting", or "tcp"
  // (kernel TCP for good: see `why`).
  std::string state;
  std::string path;  // "mapped", "fabric:<provider>", or "tcp"
  fallback why = fallback::none;
  // Application bytes each way: over kernel TCP (before the switch), over
  // VMMC after it; received VMMC bytes copied out of the ring vs placed
  // straight into the reader's buffer. For kernel-TCP rows only the first
  // pair is kept, and only up to the decision: the kernel counts the rest.
  std::uint64_t tcp_bytes_in = 0, tcp_bytes_out = 0;
  std::uint64_t vmmc_bytes_in = 0, vmmc_bytes_out = 0;
  std::uint64_t bytes_copied = 0, bytes_redirected = 0;
  // Our own bytes on the kernel connection that are no application data (the
  // offer we sent, the offer we received and refused): subtract them from the
  // kernel's counts of a kernel-TCP row.
  std::uint32_t protocol_bytes_in = 0, protocol_bytes_out = 0;
};

struct published_process {
  pid_t pid = 0;
  uid_t uid = 0;
  std::string command;  // its command line, cut to 120 bytes
  // The process answered the request for fresh counters (it has a VMMC
  // context, hence the thread that answers). False: the rows are as of the
  // last connection event, and the UTLB counters zero or old.
  bool live = false;
  bool has_context = false;
  std::uint64_t utlb_lookups = 0, utlb_hits = 0, utlb_misses = 0, utlb_registrations = 0,
                utlb_evictions = 0, utlb_bytes_registered = 0;
  std::uint32_t not_shown = 0;  // connections on descriptors beyond the file's rows
  std::vector<published_connection> connections;
};

struct read_options {
  std::string directory;  // empty: the setting VMMC_SOCKETS_STAT_DIR
  // How long to wait for each process's fresh counters (all are asked
  // first, then waited for together).
  std::chrono::milliseconds wait{300};
  pid_t only_pid = 0;  // 0: every process
};

// The processes that publish under the directory and are alive (the pid runs
// and started when the file says; files of dead processes are skipped), among
// those whose files this user may open: its own, or everyone's for root. A
// row whose descriptor no longer names its socket (closed, or lost by exec)
// is skipped where /proc/<pid>/fd can be read. Thread-safe; never throws on a
// malformed file (it is skipped).
std::vector<published_process> read_published(const read_options& options = {});

}  // namespace vmmc::sockets

#pragma GCC visibility pop
