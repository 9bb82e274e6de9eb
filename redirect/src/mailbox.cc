// redirect/src/mailbox.cc: slots, stamps, credits and arming (see
// vmmc/redirect/mailbox.h).
#include "vmmc/redirect/mailbox.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>

namespace vmmc::redirect {
namespace {

using detail::mailbox_area;
using detail::mailbox_slot;
using detail::mailbox_slots;

std::uint64_t load(const std::uint64_t& word) {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(word))
      .load(std::memory_order_acquire);
}
void store(std::uint64_t& word, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(word).store(value, std::memory_order_release);
}

// The name is the capability (the export admits anyone who knows it), so it
// must not be guessable; it travels only in its user's own exchange.
std::string fresh_name() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "mbox%x.%08x%08x.%llu", static_cast<unsigned>(::getpid()), rd(),
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
  area_->magic = detail::mailbox_magic;
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
  if (magic != detail::mailbox_magic || described->length < sizeof(mailbox_area))
    return errc::protocol_error;
  auto bound = ctx_.bind(peer_);
  if (!bound) return bound.error();
  to_peer_ = std::move(*bound);
  return {};
}

void mailbox::put(std::size_t offset, std::uint64_t value) {
  // A failure means the peer is gone; its user learns that on its other paths.
  (void)to_peer_.send(offset, &value, sizeof value);
}

// ------------------------------------------------------------------ writing

result<bool> mailbox::try_send(const void* head, std::size_t head_length, const void* body,
                               std::size_t body_length) {
  const std::size_t length = head_length + body_length;
  if (!attached_ || length > max_message || length < head_length) return false;
  if (sent_ - credit_ >= mailbox_slots) {
    credit_ = load(area_->credit);
    if (sent_ - credit_ >= mailbox_slots) return false;
  }
  const std::size_t slot =
      offsetof(mailbox_area, slots) + (sent_ % mailbox_slots) * sizeof(mailbox_slot);
  // Counted before it is written: a peer arming to sleep must learn of it.
  store(area_->own_sent, sent_ + 1);
  // Head, body, then the stamp that validates them, in one gathered send:
  // on the mapped path the stamp follows the message at once.
  const std::uint64_t stamp = ((sent_ + 1) & detail::stamp_count_mask) | std::uint64_t{length}
                                                                             << 48;
  core::send_piece pieces[3];
  std::size_t n = 0;
  const std::size_t at = slot + offsetof(mailbox_slot, message);
  if (head_length) pieces[n++] = {at, head, head_length};
  if (body_length) pieces[n++] = {at + head_length, body, body_length};
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

}  // namespace vmmc::redirect
