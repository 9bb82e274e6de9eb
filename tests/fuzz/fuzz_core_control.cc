// Fuzz target fuzz.core.control: a control stream as an exporter or importer
// receives it. Frames are cut by scan_frame; each body goes to the parser
// the product uses for its type (parse_hello + decode_address,
// parse_import_request, parse_import_reply).
#include <cstdint>

#include "core.h"
#include "fuzz_check.h"
#include "parse.h"

using namespace vmmc::core::detail;
using vmmc::errc;
using vmmc::fuzz::check;

namespace {

bool within(std::string_view part, std::span<const std::uint8_t> whole) {
  const auto* begin = reinterpret_cast<const char*>(whole.data());
  return part.data() >= begin && part.data() + part.size() <= begin + whole.size();
}

void check_body(wire::frame_type type, std::span<const std::uint8_t> body) {
  auto hello = parse_hello(type, body);
  check(!hello || type == wire::frame_type::hello);
  if (hello) {
    check(within(hello->blob, body));
    check(hello->blob.size() == hello->claims.address_length);
    check(sizeof(wire::hello_body) + hello->blob.size() == body.size());
    if (auto a = decode_address(hello->blob)) check(!a->host.empty());
  }
  if (type == wire::frame_type::import_request) {
    if (auto r = parse_import_request(body)) {
      check(within(r->name, body));
      check(r->name.size() == r->request.name_length);
      check(r->name.size() <= wire::max_name_length);
      check(r->provider.size() < sizeof r->request.provider + 1);
      check(r->provider.find('\0') == std::string_view::npos);
    }
  }
  if (type == wire::frame_type::import_reply) {
    if (auto r = parse_import_reply(body); r && r->status == 0) {
      check(r->length > 0);
      std::uint64_t end = 0;
      if (r->mapped)
        check(!__builtin_add_overflow(r->segment_offset, r->length, &end));
      else
        check(r->ring_capacity == wire::ring_slots);
      check(r->has_wake_fd == 0 || (r->has_wake_fd == 1 && r->mapped));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> stream(data, size);
  std::size_t at = 0;
  for (;;) {
    auto v = scan_frame(stream.subspan(at));
    if (!v) {
      check(v.is(errc::would_block) || v.is(errc::protocol_error));
      break;
    }
    check(v->body_offset == sizeof(wire::frame_header));
    check(v->body_length <= wire::max_frame_body);
    check(v->body_offset + v->body_length <= size - at);
    const auto body = stream.subspan(at + v->body_offset, v->body_length);
    // Descriptors are claimed only by the frames that carry them.
    if (v->type == wire::frame_type::hello_reply)
      check(v->descriptors == 0 || v->descriptors == 3);
    else if (v->type == wire::frame_type::import_reply)
      check(v->descriptors <= 2);  // the memfd, and the exporter's wake eventfd
    else
      check(v->descriptors == 0);
    check_body(v->type, body);
    at += v->body_offset + v->body_length;
  }
  check(at <= size);
  return 0;
}
