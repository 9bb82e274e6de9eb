// Fuzz target fuzz.nx.bootstrap: what a node reads at start-up: nxrun's
// answer to the all-gather (read_records, from a pipe holding the input)
// and each node's start-up record (parse_startup_record, add_cpus), the
// same for records that came through PMIx.
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>

#include "fuzz_check.h"
#include "parse.h"

using namespace vmmc::nx::detail;
using vmmc::fuzz::check;

namespace {

bool one_word(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (std::isspace(c)) return false;
  return true;
}

void startup(const std::string& text, long nodes, long node) {
  auto r = parse_startup_record(text, nodes, node);
  if (!r) return;
  check(one_word(r->host) && one_word(r->cpus) && one_word(r->address));
  check(one_word(r->descriptor) && one_word(r->mailbox));
  check(one_word(r->lane) && one_word(r->lane_key));
  std::set<int> cpus;
  add_cpus(r->cpus, cpus);
  std::size_t entries = 1;
  for (char c : r->cpus) entries += c == ',';
  check(cpus.size() <= entries);
  for (int c : cpus) check(c >= 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vmmc::fuzz::input in(data, size);
  const long nodes = 1 + in.take<std::uint8_t>() % 16;
  const long node = in.take<std::uint8_t>() % nodes;
  const std::size_t count = 1 + in.take<std::uint8_t>() % 8;
  const auto rest = in.rest();
  if (rest.size() > 60000) return 0;  // a pipe holds 64 KiB: no reader needed

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return 0;
  check(::write(fds[1], rest.data(), rest.size()) == static_cast<ssize_t>(rest.size()));
  ::close(fds[1]);
  const auto records = read_records(fds[0], count);
  ::close(fds[0]);

  check(records.empty() || records.size() == count);
  std::size_t used = 0;
  for (const auto& r : records) {
    check(r.size() <= max_record_bytes(count));
    used += sizeof(std::uint32_t) + r.size();
  }
  check(used <= rest.size());
  for (const auto& r : records) startup(r, nodes, node);
  startup(std::string(in.rest_text()), nodes, node);
  return 0;
}
