// sockets/src/stat_page.h: the layout of a process's published connection
// file (v1), written by stat.cc in the process and read by stat_reader.cc in
// vmmc-stat. Little-endian, this host only (both ends are the same build or
// check `version` and the sizes).
//
//   offset 0     page_header (one 4096-byte page, allocated at creation)
//   offset 4096  slot_count rows of 256 bytes, row i for descriptor i;
//                each 4096-byte page of rows is allocated when first used
//                (fallocate: a full /dev/shm then costs rows, never SIGBUS)
//
// Consistency: every row, and the header's counters, carry a sequence word,
// odd while the process writes them (one writer at a time: the process's
// publisher lock). A reader copies, then checks the word is even and
// unchanged, or retries. A row is shown when `in_use` is 1.
//
// Fresh counters: the reader adds 1 to `request` and wakes it (FUTEX_WAKE,
// not private: the file is shared). The process's publisher thread (started
// with its VMMC context; `refresher_tid` names it while it runs) rewrites
// every row and the UTLB counters, sets `answered` to the request it served
// and wakes it. A process without the thread (it never met a vmmc peer) has
// only rows of connections on kernel TCP, rewritten at each connection event.
// Rows written at connection events cost no system call: `inode` is 0 and an
// end may be unknown (family 0) until a refresh (or an exec(), before which
// every row is completed). A reader believes such a row while its
// descriptor names a socket, and takes that socket's inode and ends from
// /proc/<pid>/fd and /proc/<pid>/net/tcp{,6}.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "vmmc/sockets/stat.h"

namespace vmmc::sockets::detail::stat_page {

inline constexpr char magic[8] = {'v', 'm', 'm', 'c', 's', 't', 'a', 't'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t header_bytes = 4096;
inline constexpr std::size_t row_bytes = 256;
inline constexpr std::uint32_t max_rows = 1 << 16;

// An endpoint: family AF_INET / AF_INET6 (0: unknown), port in host order,
// address in network order (4 or 16 bytes).
struct endpoint {
  std::uint16_t family;
  std::uint16_t port;
  std::uint8_t address[16];
};
static_assert(sizeof(endpoint) == 20);

enum class row_state : std::uint8_t { connecting, undecided, upgrading, accelerated, tcp };
inline constexpr std::uint8_t row_state_count = 5;

struct row {
  std::atomic<std::uint32_t> sequence;
  std::uint8_t in_use;
  std::uint8_t is_client;
  std::uint8_t state;     // row_state
  std::uint8_t fallback;  // vmmc::sockets::fallback
  std::int32_t fd;
  std::uint32_t protocol_bytes_in, protocol_bytes_out;
  std::uint64_t inode;
  endpoint local, remote;
  char path[48];  // NUL-terminated: "mapped", "fabric:tcp;ofi_rxm", "tcp"
  std::uint64_t tcp_bytes_in, tcp_bytes_out;
  std::uint64_t vmmc_bytes_in, vmmc_bytes_out;
  std::uint64_t bytes_copied, bytes_redirected;
};
static_assert(sizeof(row) <= row_bytes);

struct header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t row_size;   // row_bytes
  std::uint32_t row_count;  // rows after the header
  std::int32_t pid;
  std::uint32_t uid;
  std::uint32_t reserved;
  std::uint64_t start_time;                 // /proc/<pid>/stat field 22: clock ticks after boot
  char command[128];                        // NUL-terminated
  std::atomic<std::uint32_t> request;       // futex: readers add 1
  std::atomic<std::uint32_t> answered;      // futex: the request served last
  std::atomic<std::int32_t> refresher_tid;  // 0: no thread answers
  std::atomic<std::uint32_t> rows_used;     // rows below this may be in use
  std::atomic<std::uint32_t> not_shown;     // descriptors beyond row_count
  std::atomic<std::uint32_t> sequence;      // for the fields below
  std::uint32_t has_context;
  std::uint32_t reserved2;
  std::uint64_t utlb_lookups, utlb_hits, utlb_misses, utlb_registrations, utlb_evictions,
      utlb_bytes_registered;
};
static_assert(sizeof(header) <= header_bytes);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// --- stat.cc
// A /proc stat file ("/proc/self/stat", "/proc/thread-self/stat" ...): the
// id it shows (field 1) and the start time (field 22, clock ticks after
// boot). Ids are those of the pid namespace /proc belongs to, which readers
// see, not necessarily getpid()'s. False if it cannot be read.
bool proc_stat(const char* path, long& id, std::uint64_t& start_time);
// When process `pid` (as /proc names it) started; 0 if unknown. A file whose
// `start_time` differs belongs to an earlier process of the same pid.
std::uint64_t start_time(pid_t pid);

// --- stat_parse.cc: what a reader checks before believing a file.
// `text` up to its NUL or `capacity` bytes.
std::string bounded(const char* text, std::size_t capacity);
// A header of ours, of this version, for process `pid`, in a file of
// `file_bytes` bytes that holds all its rows.
bool header_ok(const header& h, std::uint64_t file_bytes, std::int64_t pid);
// The connection row `index` describes: nullopt unless it is in use and
// well-formed (its descriptor is `index`, its state one we know).
std::optional<published_connection> parse_row(const row& r, std::uint32_t index);
// The ends of socket `inode` ("127.0.0.1:6379") as the text of a
// /proc/<pid>/net/tcp or tcp6 file lists them; false if it is not there.
bool ends_in_proc_net(std::string_view table, std::uint64_t inode, std::string& local,
                      std::string& remote);

}  // namespace vmmc::sockets::detail::stat_page
