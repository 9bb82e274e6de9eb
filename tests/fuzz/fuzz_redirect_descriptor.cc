// Fuzz target fuzz.redirect.descriptor: the channel descriptor string
// (parse_descriptor), as a peer places it in its hello or an upper layer
// passes it on. What it accepts keeps the format's rules and reads back the
// same from the descriptor the channel would print for it.
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "parse.h"

using namespace vmmc::redirect;
using vmmc::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  detail::parsed_descriptor d;
  if (!detail::parse_descriptor(text, d)) return 0;
  check(size < wire::descriptor_max);
  check(!d.name.empty() && d.name.size() < wire::name_max);
  check(d.name.find('#') == std::string::npos);
  check(d.ring_bytes >= detail::page && d.ring_bytes <= detail::max_ring_bytes);
  check((d.ring_bytes & (d.ring_bytes - 1)) == 0);
  check(!d.address.empty());
  for (char c : d.name + d.address) check(c > ' ' && c <= '~');
  const std::string again = d.name + "#" + std::to_string(d.ring_bytes) + "#" + d.address;
  detail::parsed_descriptor e;
  check(detail::parse_descriptor(again, e));
  check(e.name == d.name && e.ring_bytes == d.ring_bytes && e.address == d.address);
  return 0;
}
