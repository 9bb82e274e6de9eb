// Fuzz target fuzz.nx.header: the 32-byte message header a peer node sends
// on a channel or places in a mailbox slot (wire::valid,
// wire::valid_in_mailbox). What they accept keeps wire.h's rules, sizes a
// payload without overflow, and fits a slot when it claims to.
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "wire.h"

using namespace vmmc::nx::detail;
using vmmc::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vmmc::fuzz::input in(data, size);
  const auto h = in.take<wire::header>();
  const bool valid = wire::valid(h);
  if (valid) {
    check(h.magic[0] == 'N' && h.magic[1] == 'X' && h.version == wire::version);
    check(h.space == 1 || h.space == 2 || h.space == wire::control_space);
    check(h.length >= 0 && h.type >= 0 && h.type <= wire::max_type);
    check(h.space != wire::control_space || h.length == 0);
    std::size_t total = 0;  // take_whole: header and payload in one read
    check(!__builtin_add_overflow(sizeof h, static_cast<std::size_t>(h.length), &total));
    // What the sender builds for these fields is accepted too.
    auto again = wire::make_header(h.space, static_cast<long>(h.type), static_cast<long>(h.length),
                                   static_cast<long>(h.ptype));
    check(wire::valid(again));
  }
  if (wire::valid_in_mailbox(h)) {
    check(valid && static_cast<std::uint64_t>(h.length) <= wire::mailbox_payload_max);
    // take_mail copies the payload out of the slot.
    auto slot = std::make_unique<vmmc::redirect::detail::mailbox_slot>();
    check(sizeof h + static_cast<std::size_t>(h.length) <= vmmc::redirect::mailbox::max_message);
    std::vector<std::byte> out(static_cast<std::size_t>(h.length));
    if (!out.empty()) std::memcpy(out.data(), slot->message + sizeof h, out.size());
  }
  return 0;
}
