// Fuzz target fuzz.redirect.area: the words a channel's peer writes into
// (or serves from) an area: the area's first words (check_area), P's hello
// (copy_hello, then its descriptor), P's post as the writer places bytes
// into it (place_in_post) and P's report on our post (check_report). Each
// accepted value is used as the channel uses it, on buffers of exactly the
// sizes involved, so ASan sees any byte outside them.
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "parse.h"

using namespace vmmc::redirect;
using vmmc::fuzz::check;

namespace {

void area(vmmc::fuzz::input& in) {
  std::uint64_t words[3] = {wire::area_magic, 0, 0};
  if (in.take<std::uint8_t>() & 1) words[0] = in.take<std::uint64_t>();
  words[1] = in.take<std::uint64_t>();
  words[2] = in.take<std::uint64_t>();
  const auto ring_bytes = in.take<std::uint64_t>(), export_length = in.take<std::uint64_t>();
  if (!detail::check_area(words, ring_bytes, export_length)) return;
  check(words[0] == wire::area_magic && words[1] == ring_bytes);
  check(words[2] % detail::page == 0 && words[2] >= sizeof(wire::area_header));
  std::uint64_t end = 0;
  check(!__builtin_add_overflow(words[2], ring_bytes, &end) && end <= export_length);
}

void hello(vmmc::fuzz::input& in) {
  auto h = std::make_unique<wire::hello>();
  const auto bytes = in.take_bytes(sizeof(wire::hello));
  std::memcpy(h.get(), bytes.data(), bytes.size());
  auto copy = detail::copy_hello(*h);
  if (!copy) return;
  check(copy->user.size() <= wire::user_hello_max);
  check(copy->descriptor.size() < wire::descriptor_max);
  detail::parsed_descriptor d;
  (void)detail::parse_descriptor(copy->descriptor, d);
}

void post(vmmc::fuzz::input& in) {
  const auto position = in.take<std::uint64_t>(), post_length = in.take<std::uint64_t>();
  const auto start = in.take<std::uint64_t>();
  const std::size_t length = in.take<std::uint32_t>();
  const auto p = detail::place_in_post(position, post_length, start, length);
  const bool inside = start >= position && start - position < post_length && length > 0;
  check(inside == (p.count > 0));
  if (!p.count) return;
  check(p.count <= length && p.offset == start - position);
  std::uint64_t end = 0;
  check(!__builtin_add_overflow(p.offset, p.count, &end) && end <= post_length);
}

void report(vmmc::fuzz::input& in) {
  const auto start = in.take<std::uint64_t>(), redirected = in.take<std::uint64_t>();
  const auto post_start = in.take<std::uint64_t>();
  const std::uint64_t post_length = in.take<std::uint16_t>();  // a buffer we can allocate
  auto r = detail::check_report(start, redirected, post_start, post_length);
  if (!r) return;
  check(start >= post_start && r->redirected == redirected);
  std::uint64_t end = 0;
  check(!__builtin_add_overflow(r->from_ring, r->redirected, &end) && end <= post_length);
  // step_post: ring bytes first, then the redirected ones, in the posted buffer.
  std::vector<std::uint8_t> buffer(post_length);
  if (r->from_ring) std::memset(buffer.data(), 1, r->from_ring);
  if (r->redirected) std::memset(buffer.data() + (start - post_start), 2, r->redirected);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vmmc::fuzz::input in(data, size);
  switch (in.take<std::uint8_t>() % 4) {
    case 0:
      area(in);
      break;
    case 1:
      hello(in);
      break;
    case 2:
      post(in);
      break;
    default:
      report(in);
      break;
  }
  return 0;
}
