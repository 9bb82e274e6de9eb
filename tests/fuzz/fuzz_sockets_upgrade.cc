// Fuzz target fuzz.sockets.upgrade: the upgrade bytes a stream's peer sends
// over TCP: the hello frame after [accept] (hello_frame_ok), the raw byte
// count in its channel hello (parse_raw_count), and the doorbell / revert
// request / end records after its switch (scan_records, checked against a
// plain reading of wire.h and drained the way drain_doorbells does).
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "parse.h"

using namespace vmmc::sockets;
using vmmc::fuzz::check;

namespace {

void hello(vmmc::fuzz::input& in) {
  const auto frame = in.take<wire::hello_frame>();
  if (detail::hello_frame_ok(frame))
    check(frame.magic == wire::hello_magic && frame.version == wire::version && frame.length > 0);
  const std::string_view text = in.rest_text().substr(0, 32);
  auto n = detail::parse_raw_count(text);
  if (!n) return;
  // Digits only, and the value they spell (leading zeros aside).
  std::string digits(text);
  for (char c : digits) check(c >= '0' && c <= '9');
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
  check(std::to_string(*n) == digits);
}

void records(vmmc::fuzz::input& in) {
  auto bytes = in.rest();
  while (!bytes.empty()) {
    // What the product reads at once: up to 256 bytes (its scratch buffer).
    const auto seen = bytes.first(std::min<std::size_t>(bytes.size(), 256));
    const auto scan = detail::scan_records(seen);
    check(scan.take <= seen.size());
    std::size_t end_at = seen.size();  // where the first end record starts
    for (std::size_t i = 0; i < seen.size(); ++i)
      if (seen[i] == wire::end_record_byte) {
        end_at = i;
        break;
      }
    bool asked = false;
    for (std::size_t i = 0; i < end_at; ++i) asked |= seen[i] == wire::revert_request_byte;
    check(scan.revert_asked == asked);
    if (end_at == seen.size()) {
      check(!scan.end && scan.take == seen.size());
    } else if (seen.size() - end_at < wire::end_record_size) {
      check(!scan.end && scan.take == end_at);
    } else {
      check(scan.end && scan.take == end_at + wire::end_record_size);
      std::uint64_t v = 0;
      for (std::size_t k = 0; k < 8; ++k) v |= std::uint64_t{seen[end_at + 1 + k]} << (8 * k);
      check(*scan.end == v);
    }
    // As drain_doorbells: stop at an end record, or when it cannot be read whole yet.
    if (scan.end || scan.take < seen.size()) break;
    bytes = bytes.subspan(scan.take);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vmmc::fuzz::input in(data, size);
  if (in.take<std::uint8_t>() & 1)
    records(in);
  else
    hello(in);
  return 0;
}
