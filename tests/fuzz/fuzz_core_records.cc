// Fuzz target fuzz.core.records: notification records an importer writes
// into an exporter's memory. A fabric ring slot (plan_record: applied to
// a stand-in export, so ASan sees any byte outside it) and the mapped ring's
// indices and records (drain_ring).
#include <cstdint>
#include <memory>
#include <vector>

#include "core.h"
#include "fuzz_check.h"
#include "parse.h"

using namespace vmmc::core::detail;
using vmmc::fuzz::check;

namespace {

void fabric_record(vmmc::fuzz::input& in) {
  const auto h = in.take<wire::record_header>();
  // Small exports, so that the copy below can be made for real.
  const std::uint64_t export_length = in.take<std::uint16_t>() % 4097;
  const bool writable = in.take<std::uint8_t>() & 1;
  const auto payload = in.take_bytes(wire::ring_inline_max);
  const record_plan plan = plan_record(h, export_length, writable, payload.size());
  if (!plan.copy && !plan.notify) return;
  check(h.magic == wire::record_magic);
  std::uint64_t end = 0;
  check(!__builtin_add_overflow(h.offset, h.length, &end) && end <= export_length);
  if (plan.copy) {
    check(h.type == static_cast<std::uint32_t>(wire::record_type::inline_update));
    check(writable && h.length <= payload.size());
    std::vector<std::uint8_t> region(export_length);
    if (h.length) std::memcpy(region.data() + h.offset, payload.data(), h.length);
  } else {
    check(h.type == static_cast<std::uint32_t>(wire::record_type::notify));
  }
  check(plan.notify == (h.notify != 0));
}

void mapped_ring(vmmc::fuzz::input& in) {
  auto ring = std::make_unique<notify_ring>();
  const auto head = in.take<std::uint64_t>(), tail = in.take<std::uint64_t>();
  ring->head.store(head);
  ring->tail.store(tail);
  for (auto& r : ring->records) {
    if (in.rest().empty()) break;
    r = in.take<notify_record>();
  }
  std::vector<vmmc::core::notification> out(1);  // what the caller had already: kept
  const bool ok = drain_ring(*ring, out);
  check(out.size() >= 1);
  if (!ok) {
    check(out.size() == 1 && ring->head.load() == head);
    return;
  }
  check(tail - head <= notify_ring::capacity);
  check(out.size() - 1 == tail - head && ring->head.load() == tail);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vmmc::fuzz::input in(data, size);
  if (in.take<std::uint8_t>() & 1)
    mapped_ring(in);
  else
    fabric_record(in);
  return 0;
}
