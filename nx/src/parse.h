// parse.h: what a node reads from the other nodes at start-up (through
// nxrun's socket or PMIx), apart from the launch machinery, so that the
// product and the fuzz targets (tests/fuzz) run the same code.
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace vmmc::nx::detail {

// The most a node's start-up record may take in a job of `nodes`: its host,
// pid, CPU list and address, then a channel descriptor and a mailbox name
// per node (each far below 4 KiB), then its TCP lane.
constexpr std::size_t max_record_bytes(std::size_t nodes) {
  return 64 * 1024 + nodes * 4096;
}

// nxrun's answer to the all-gather on `fd`: `count` records, each
// <u32 length><bytes> with length <= max_record_bytes(count). Empty on a
// short read or a longer length.
std::vector<std::string> read_records(int fd, std::size_t count);
// One record as read_records reads it: a node sends its own to nxrun, and
// nxrun answers with every node's, back to back.
std::string record(std::string_view bytes);
// Writes all `n` bytes; false on an error or a closed peer.
bool write_all(int fd, const void* data, std::size_t n);

// A node's start-up record as node `node` of `nodes` reads it:
// "<host> <pid> <cpus> <address> <descriptor or -> x nodes <mailbox or -> x nodes
// <lane or -> <lane key>", of which `node` takes the descriptor and mailbox
// meant for it; `lane` is where the node takes kernel TCP connections from
// nodes on other hosts ("ip:port"), and they must present `lane_key`.
struct startup_record {
  std::string host;
  long pid = 0;
  std::string cpus, address, descriptor, mailbox, lane, lane_key;
};
std::optional<startup_record> parse_startup_record(const std::string& text, long nodes, long node);

// Adds the CPU numbers of a comma-separated list ("0,2,3") to `into`;
// entries that are not a CPU number are skipped.
void add_cpus(std::string_view list, std::set<int>& into);

}  // namespace vmmc::nx::detail
