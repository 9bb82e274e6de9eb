// Fuzz target fuzz.sockets.stat: a file another process published for
// vmmc-stat (sockets/src/stat_page.h), as the reader checks it before it
// believes anything: the header (header_ok), then each row (parse_row),
// whose strings must stay bounded whatever the bytes. The input is the
// header, the file's size (8 bytes), then rows; the same bytes are also read
// as a /proc/net/tcp text (ends_in_proc_net).
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "stat_page.h"

using namespace vmmc::sockets::detail;
using vmmc::fuzz::check;

namespace {
// The bytes as a T (zeros past the input's end); T holds atomics, so no take<T>.
template <class T>
void take_into(vmmc::fuzz::input& in, T& value) {
  auto bytes = in.take_bytes(sizeof value);
  std::memset(static_cast<void*>(&value), 0, sizeof value);
  if (!bytes.empty()) std::memcpy(static_cast<void*>(&value), bytes.data(), bytes.size());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The same bytes as a /proc/<pid>/net/tcp text, where the reader finds
  // the ends of a row published without them.
  std::string local, remote;
  if (stat_page::ends_in_proc_net({reinterpret_cast<const char*>(data), size}, 1 + size % 1024,
                                  local, remote))
    check(!local.empty() && local.size() <= 48 && !remote.empty() && remote.size() <= 48);
  vmmc::fuzz::input in(data, size);
  stat_page::header h;
  take_into(in, h);
  const auto file_bytes = in.take<std::uint64_t>();
  if (stat_page::header_ok(h, file_bytes, h.pid)) {
    check(h.row_count <= stat_page::max_rows && h.pid > 0);
    check(file_bytes >=
          stat_page::header_bytes + std::uint64_t{h.row_count} * stat_page::row_bytes);
  }
  check(stat_page::bounded(h.command, sizeof h.command).size() <= sizeof h.command);
  for (std::uint32_t i = 0; !in.rest().empty() && i < 64; ++i) {
    stat_page::row r;
    take_into(in, r);
    auto c = stat_page::parse_row(r, i);
    if (!c) continue;
    check(c->fd == static_cast<int>(i) && r.in_use && r.state < stat_page::row_state_count);
    check(c->path.size() < sizeof r.path + 1);
    // "?", "a.b.c.d:port" or "[v6]:port": never empty, never long.
    check(!c->local.empty() && c->local.size() <= 48);
    check(!c->remote.empty() && c->remote.size() <= 48);
  }
  return 0;
}
