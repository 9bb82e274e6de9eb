// nx/src/mailbox.cc: slots, stamps, credits and arming (see mailbox.h).
#include "mailbox.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>

namespace vmmc::nx::detail {
namespace {

using wire::mailbox_area;
using wire::mailbox_slot;
using wire::mailbox_slots;

std::uint64_t load(const std::uint64_t& word) {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(word))
      .load(std::memory_order_acquire);
}
void store(std::uint64_t& word, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(word).store(value, std::memory_order_release);
}

// The name is the capability (the export admits anyone who knows it), so it
// must not be guessable; it only travels in the job's own start-up exchange.
std::string fresh_name() {
  static std::uint64_t counter = 0;
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "nxmb%x.%08x%08x.%llu", static_cast<unsigned>(::getpid()), rd(),
                rd(), static_cast<unsigned long long>(++counter));
  return buf;
}

}  // namespace

mailbox::~mailbox() {
  if (attached_) (void)ctx_.unimport_buffer(peer_);
  memory_ = core::mappable_buffer{};  // goes with the export: no pages to move at unexport
  if (exported_) (void)ctx_.unexport_buffer(export_);
}

status mailbox::create() {
  auto memory = ctx_.allocate(sizeof(mailbox_area));
  if (!memory) return memory.error();
  memory_ = std::move(*memory);
  area_ = new (memory_.data()) mailbox_area{};
  area_->magic = wire::mailbox_magic;
  name_ = fresh_name();
  core::export_options options;
  options.allowed = core::rights::read_write;
  options.policy = core::import_policy::anyone();
  auto h = ctx_.export_buffer(name_, memory_.data(), sizeof(mailbox_area), std::move(options));
  if (!h) return h.error();
  export_ = *h;
  exported_ = true;
  return {};
}

status mailbox::attach(std::string_view address, std::string_view name) {
  auto h = ctx_.import_buffer(address, name);
  if (!h) return h.error();
  peer_ = *h;
  attached_ = true;
  std::uint64_t magic = 0;
  if (status s = ctx_.fetch(peer_, offsetof(mailbox_area, magic), &magic, sizeof magic); !s)
    return s;
  auto described = ctx_.describe(peer_);
  if (!described) return described.error();
  if (magic != wire::mailbox_magic || described->length < sizeof(mailbox_area))
    return errc::protocol_error;
  auto bound = ctx_.bind(peer_);
  if (!bound) return bound.error();
  to_peer_ = std::move(*bound);
  return {};
}

void mailbox::put(std::size_t offset, std::uint64_t value) {
  // A failure means the peer is gone; the channels report that.
  (void)to_peer_.send(offset, &value, sizeof value);
}

// ------------------------------------------------------------------ writing

result<bool> mailbox::try_send(const wire::header& h, const void* payload) {
  const auto length = static_cast<std::size_t>(h.length);
  if (!attached_ || length > wire::mailbox_payload_max) return false;
  if (sent_ - credit_ >= mailbox_slots) {
    credit_ = load(area_->credit);
    if (sent_ - credit_ >= mailbox_slots) return false;
  }
  const std::size_t slot =
      offsetof(mailbox_area, slots) + (sent_ % mailbox_slots) * sizeof(mailbox_slot);
  // Counted before it is written: a peer arming to sleep must learn of it.
  store(area_->own_sent, sent_ + 1);
  // Header, payload, then the stamp that validates them, in one gathered
  // send: on the mapped path the stamp follows the message at once.
  const std::uint64_t stamp = sent_ + 1;
  core::send_piece pieces[3];
  std::size_t n = 0;
  pieces[n++] = {slot + offsetof(mailbox_slot, h), &h, sizeof h};
  if (length) pieces[n++] = {slot + offsetof(mailbox_slot, payload), payload, length};
  pieces[n++] = {slot + offsetof(mailbox_slot, stamp), &stamp, sizeof stamp};
  if (status s = to_peer_.send(std::span(pieces, n)); !s) return s.error();
  ++sent_;
  // Credits are read behind the message, while it travels, rather than in
  // front of the next one: the peer wrote them, so the read is a miss.
  if (sent_ - credit_ >= mailbox_slots / 2) credit_ = load(area_->credit);
  return true;
}

bool mailbox::peer_wants_wakeup() {
  // Our own_sent and stamp before the peer's arming word: pairs with the
  // fence in prepare_sleep().
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::uint64_t armed = load(area_->armed);
  if (armed <= last_rung_) return false;
  last_rung_ = armed;
  return true;
}

// ------------------------------------------------------------------ reading

const mailbox_slot* mailbox::next() {
  const mailbox_slot& s = area_->slots[taken_ % mailbox_slots];
  if (load(s.stamp) == taken_ + 1) return &s;
  // Not there yet. While polling, pull in the slot's further lines, as many
  // as the last message had (the next is likely the same size): read after
  // the stamp, each would cost one more transfer between the cores in turn
  // (64 B one-way 0.48-0.50 against 0.36-0.37 us).
  // Prefetching never faults, and a line the writer then takes is simply
  // fetched again.
  const auto* line = reinterpret_cast<const char*>(&s);
  for (std::size_t l = 1; l <= prefetch_lines_; ++l) __builtin_prefetch(line + 64 * l);
  return nullptr;
}

void mailbox::consume(std::size_t length) {
  // Past 8 lines, prefetching races the writer still copying the rest (a
  // 1 KiB message measured slower with it).
  const std::size_t lines = (offsetof(mailbox_slot, payload) + length + 63) / 64 - 1;
  prefetch_lines_ = lines <= 8 ? lines : 0;
  ++taken_;
  // A reader kept busy returns credits every half of the slots; the writer
  // falls back to the stream meanwhile, so it never waits for them.
  if (taken_ - credited_ >= mailbox_slots / 2) give_credit();
}

void mailbox::give_credit() {
  if (!attached_) return;
  put(offsetof(mailbox_area, credit), taken_);
  credited_ = taken_;
}

bool mailbox::prepare_sleep() {
  if (!attached_) return true;
  if (next()) return false;
  put(offsetof(mailbox_area, armed), ++arm_epoch_);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Ordered behind the arming write: what the writer had counted when our
  // arm landed. More than we took means a message is on its way that the
  // writer will not ring for.
  std::uint64_t sent = 0;
  if (!ctx_.fetch(peer_, offsetof(mailbox_area, own_sent), &sent, sizeof sent)) return false;
  return sent <= taken_;
}

}  // namespace vmmc::nx::detail
