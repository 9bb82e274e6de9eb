// poll, select and epoll over a mix of kernel descriptors and streams whose
// data arrives through a channel. For those streams the kernel descriptor
// still wakes a sleeper (doorbell bytes, records, end of file), and so does
// the channel's wait descriptor, which a peer on this host writes instead
// of a doorbell byte; readiness itself is the channel's. Waits busy-poll
// channels briefly, then arm the doorbells and sleep in the kernel.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "descriptor_map.h"
#include "sockets.h"
#include "vmmc/core/progress.h"
#include "vmmc/sockets/socket.h"

namespace vmmc::sockets {

using namespace detail;

namespace {
using clock = std::chrono::steady_clock;

// Streams whose readiness is not simply the kernel's.
bool needs_us(const stream& s) {
  phase p = s.state.load(std::memory_order_relaxed);
  return p == phase::connecting || p == phase::undecided || p == phase::upgraded ||
         stash_size(s) > 0;
}

// Only the kernel can make it ready: no channel and no bytes of ours held.
// (A connection still connecting gets a look before the wait too: connected
// by now, its offer goes at once.)
bool kernel_only(const stream& s) {
  const phase p = s.state.load(std::memory_order_relaxed);
  return p != phase::upgraded && p != phase::connecting && stash_size(s) == 0;
}

clock::time_point deadline_after(int timeout_ms) {
  return timeout_ms < 0 ? clock::time_point::max()
                        : clock::now() + std::chrono::milliseconds(timeout_ms);
}

int milliseconds_until(clock::time_point deadline) {
  if (deadline == clock::time_point::max()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// What to ask the kernel for a stream of ours: its doorbells and end of file
// always, the rest only where the kernel still decides.
short kernel_interest(stream& s, short wanted) {
  short events = POLLIN;
  phase p = s.state.load();
  // Connected: the moment our offer goes, whatever the caller waits for.
  if (p == phase::connecting) return static_cast<short>(wanted | POLLIN | POLLPRI | POLLOUT);
  if (p != phase::upgraded) return static_cast<short>(wanted | POLLIN | POLLPRI);
  if (!s.out.on_channel()) events |= wanted & (POLLOUT | POLLWRNORM);
  // The peer's end comes over TCP while its bytes do (before its switch, and
  // after its end record); once they come through the channel its FIN would
  // say nothing and, level-triggered, wake every wait.
  if (!s.in.switched() || input_on_tcp(s)) events |= wanted & POLLRDHUP;
  return events;
}

short reportable(short events, short wanted) {
  return events & (wanted | POLLERR | POLLHUP | POLLNVAL);
}

struct poll_state {
  std::vector<std::pair<nfds_t, stream_ptr>> ours;
  std::vector<short> wanted;
  // Wait descriptors the last arming promised to watch (index into ours,
  // descriptor), and the caller's descriptors with them for the kernel.
  std::vector<std::pair<std::size_t, int>> watched;
  std::vector<pollfd> all;
};

// The kernel's poll of the caller's descriptors and of the wait
// descriptors we watch; the caller's entries get their revents.
int kernel_poll(pollfd* fds, nfds_t count, int timeout_ms, poll_state& st) {
  if (st.watched.empty()) return ::poll(fds, count, timeout_ms);
  st.all.assign(fds, fds + count);
  for (const auto& [k, fd] : st.watched) st.all.push_back({fd, POLLIN, 0});
  const int n = ::poll(st.all.data(), st.all.size(), timeout_ms);
  if (n < 0) return n;
  for (nfds_t i = 0; i < count; ++i) fds[i].revents = st.all[i].revents;
  for (std::size_t j = 0; j < st.watched.size(); ++j)
    if (st.all[count + j].revents) st.ours[st.watched[j].first].second->chan->clear_wait_fd();
  return n;
}

// After a kernel poll: our streams' revents from their channels.
int finish_poll(pollfd* fds, nfds_t count, poll_state& st) {
  for (std::size_t k = 0; k < st.ours.size(); ++k) {
    pollfd& p = fds[st.ours[k].first];
    p.events = st.wanted[k];
    p.revents = reportable(ready_events(*st.ours[k].second, p.events, p.revents), p.events);
  }
  int ready = 0;
  for (nfds_t i = 0; i < count; ++i) ready += fds[i].revents != 0;
  return ready;
}

bool any_channel(const poll_state& st) {
  for (const auto& [index, s] : st.ours)
    if (s->state.load(std::memory_order_relaxed) == phase::upgraded) return true;
  return false;
}

bool any_channel_ready(poll_state& st) {
  for (std::size_t k = 0; k < st.ours.size(); ++k)
    if (reportable(ready_events(*st.ours[k].second, st.wanted[k], 0), st.wanted[k])) return true;
  return false;
}

// The wait of poll() and epoll_wait() once our streams are among the
// descriptors. `look(timeout_ms)` asks the kernel and our streams once (the
// count of ready descriptors, or -1). Between looks core's wait busy-polls
// our channels (no system call), then arms their doorbells (`arm`: false,
// news is on its way) and the kernel's look is the sleep. A wait over
// descriptors only the kernel makes ready (`kernel_members`: a listener, a
// pipe, a connection still on TCP) looks at them first, as the kernel would;
// one over channels alone gives the kernel its first look at the spin's
// second turn, so one that sleeps at once, as on a machine with more
// runnable threads than CPUs, makes one system call, as without us (it made
// two: 27.5k polls where pgbench's ppoll made 12.4k). Members that have no
// channel yet (connections still deciding) give nothing to busy-poll: the
// kernel's look is the whole wait.
template <class Look, class Ready, class Arm, class HasChannels>
int wait_for_readiness(int timeout_ms, bool deciding_only, bool kernel_members, Look look,
                       Ready channels_ready, Arm arm, HasChannels has_channels) {
  const auto deadline = deadline_after(timeout_ms);
  int n = 0;
  if (deciding_only || kernel_members || timeout_ms == 0) {
    n = look(deciding_only ? milliseconds_until(deadline) : 0);
    if (n != 0 || timeout_ms == 0 || clock::now() >= deadline) return n;
  }
  unsigned turns = 0;
  bool kernel_found = false;
  auto ready = [&] {
    if (channels_ready()) return true;
    if (++turns != 2) return false;
    n = look(0);
    return kernel_found = n != 0;
  };
  auto sleep = [&](std::chrono::nanoseconds) {
    n = look(!has_channels() || arm() ? milliseconds_until(deadline) : 0);
    return n == 0 && clock::now() < deadline;
  };
  for (;;) {
    switch (core::wait_until(ready, deadline, core::sleep_step(sleep), {.spin = has_channels()})) {
      case core::waited::stopped:  // the kernel's look: ready, failed, or the deadline came
        return n;
      case core::waited::timed_out:
        return look(0);
      case core::waited::done:  // ready: say which
        if (kernel_found || (n = look(0)) != 0) return n;
        break;
    }
  }
}
}  // namespace

int poll(pollfd* fds, nfds_t count, int timeout_ms) {
  detail::api_call entered;
  thread_local poll_state st;
  st.ours.clear();
  st.wanted.clear();
  st.watched.clear();
  for (nfds_t i = 0; i < count; ++i) {
    if (fds[i].fd < 0) continue;
    stream_ptr s = find(fds[i].fd);
    if (s && needs_us(*s)) {
      st.ours.emplace_back(i, std::move(s));
      st.wanted.push_back(fds[i].events);
    }
  }
  if (st.ours.empty()) return ::poll(fds, count, timeout_ms);
  busy_call busy;
  auto look = [&](int ms) {
    for (std::size_t k = 0; k < st.ours.size(); ++k)
      fds[st.ours[k].first].events = kernel_interest(*st.ours[k].second, st.wanted[k]);
    if (kernel_poll(fds, count, ms, st) < 0) {
      int saved = errno;
      for (std::size_t k = 0; k < st.ours.size(); ++k) fds[st.ours[k].first].events = st.wanted[k];
      errno = saved;
      return -1;
    }
    return finish_poll(fds, count, st);
  };
  auto arm = [&] {
    st.watched.clear();
    for (std::size_t k = 0; k < st.ours.size(); ++k) {
      const int fd = wait_fd_of(*st.ours[k].second);
      if (fd >= 0) st.watched.emplace_back(k, fd);
      if (!prepare_sleep(*st.ours[k].second, st.wanted[k],
                         fd >= 0 ? redirect::wake_by::wait_fd : redirect::wake_by::doorbell))
        return false;
    }
    return true;
  };
  bool kernel_only_members = std::all_of(st.ours.begin(), st.ours.end(),
                                         [](const auto& o) { return kernel_only(*o.second); });
  const auto valid = static_cast<std::size_t>(
      std::count_if(fds, fds + count, [](const pollfd& p) { return p.fd >= 0; }));
  const bool kernel_members =
      kernel_only_members || valid > st.ours.size() ||
      std::any_of(st.ours.begin(), st.ours.end(), [](const auto& o) {
        return o.second->state.load(std::memory_order_relaxed) != phase::upgraded;
      });
  return wait_for_readiness(
      timeout_ms, kernel_only_members, kernel_members, look, [&] { return any_channel_ready(st); },
      arm, [&] { return any_channel(st); });
}

int ppoll(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask) {
  detail::api_call entered;
  bool ours = false;
  for (nfds_t i = 0; i < count && !ours; ++i)
    if (stream_ptr s = fds[i].fd >= 0 ? find(fds[i].fd) : nullptr) ours = needs_us(*s);
  if (!ours) return ::ppoll(fds, count, timeout, mask);
  int ms = timeout
               ? static_cast<int>(timeout->tv_sec * 1000 + (timeout->tv_nsec + 999999) / 1000000)
               : -1;
  // Not atomic with respect to the mask, unlike the kernel's ppoll.
  sigset_t saved;
  if (mask) ::pthread_sigmask(SIG_SETMASK, mask, &saved);
  int r = vmmc::sockets::poll(fds, count, ms);
  int e = errno;
  if (mask) ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  errno = e;
  return r;
}

namespace {
int select_through_poll(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional,
                        int timeout_ms, const sigset_t* mask) {
  thread_local std::vector<pollfd> fds;
  fds.clear();
  for (int fd = 0; fd < nfds; ++fd) {
    short events = 0;
    if (readable && FD_ISSET(fd, readable)) events |= POLLIN;
    if (writable && FD_ISSET(fd, writable)) events |= POLLOUT;
    if (exceptional && FD_ISSET(fd, exceptional)) events |= POLLPRI;
    if (events) fds.push_back({fd, events, 0});
  }
  sigset_t saved;
  if (mask) ::pthread_sigmask(SIG_SETMASK, mask, &saved);
  int r = vmmc::sockets::poll(fds.data(), fds.size(), timeout_ms);
  int e = errno;
  if (mask) ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (r < 0) {
    errno = e;
    return -1;
  }
  int bits = 0;
  for (const pollfd& p : fds) {
    if (p.revents & POLLNVAL) {
      errno = EBADF;
      return -1;
    }
  }
  if (readable) FD_ZERO(readable);
  if (writable) FD_ZERO(writable);
  if (exceptional) FD_ZERO(exceptional);
  for (const pollfd& p : fds) {
    if ((p.events & POLLIN) && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(p.fd, readable);
      ++bits;
    }
    if ((p.events & POLLOUT) && (p.revents & (POLLOUT | POLLERR))) {
      FD_SET(p.fd, writable);
      ++bits;
    }
    if ((p.events & POLLPRI) && (p.revents & POLLPRI)) {
      FD_SET(p.fd, exceptional);
      ++bits;
    }
  }
  return bits;
}

bool any_of_ours(int nfds, fd_set* a, fd_set* b, fd_set* c) {
  for (int fd = 0; fd < nfds; ++fd)
    if ((a && FD_ISSET(fd, a)) || (b && FD_ISSET(fd, b)) || (c && FD_ISSET(fd, c)))
      if (stream_ptr s = find(fd); s && needs_us(*s)) return true;
  return false;
}
}  // namespace

int select(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional, timeval* timeout) {
  detail::api_call entered;
  if (!any_of_ours(nfds, readable, writable, exceptional))
    return ::select(nfds, readable, writable, exceptional, timeout);
  int ms =
      timeout ? static_cast<int>(timeout->tv_sec * 1000 + (timeout->tv_usec + 999) / 1000) : -1;
  return select_through_poll(nfds, readable, writable, exceptional, ms, nullptr);
}

int pselect(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional,
            const timespec* timeout, const sigset_t* mask) {
  detail::api_call entered;
  if (!any_of_ours(nfds, readable, writable, exceptional))
    return ::pselect(nfds, readable, writable, exceptional, timeout, mask);
  int ms = timeout
               ? static_cast<int>(timeout->tv_sec * 1000 + (timeout->tv_nsec + 999999) / 1000000)
               : -1;
  return select_through_poll(nfds, readable, writable, exceptional, ms, mask);
}

// ------------------------------------------------------------------ epoll
//
// A descriptor whose readiness can never be ours (not a stream of ours, a
// listener, or one on kernel TCP for good) is registered in the kernel with
// the caller's own event and is not kept here: the kernel's answer for it is
// the caller's, and a set of such descriptors costs a wait nothing. So is a
// deferred stream (kernel TCP until it earns a channel), which the stream
// remembers until it upgrades (registration_for). A stream that may be
// ours (a member) is registered with member_tag and its number as
// data, and the caller's event (events + data) is kept here; its events are
// translated back on the way out. Members are registered for EPOLLIN
// (doorbells) and lose EPOLLOUT in the kernel once their writes go through
// the channel, whose space we check ourselves. A stream's wait descriptor
// joins the set, edge-triggered (never read), at its first sleep, with
// wake_tag and its stream's number as data: its event only ends the sleep.
// Caller data that looks like a tag makes a member too, so no kernel
// answer is ever taken for what it is not.
namespace {
struct interest {
  // The stream behind the member, looked up once (epoll_ctl) rather than in
  // every round; dropped once its last descriptor is closed.
  stream_ptr stream;
  epoll_event user{};
  std::uint32_t kernel_events = 0;
  std::uint64_t reported_activity = ~std::uint64_t{0};
  bool disabled = false;  // EPOLLONESHOT fired
  // The kernel reported it in its last answer: in a round that does not ask
  // the kernel, a level-triggered member is asked alone (it may still hold
  // bytes, and level-triggered means reported again while it does).
  bool kernel_ready = false;
  int wait_fd = -1;                  // the stream's wait descriptor, registered in the set
  std::uint64_t reported_round = 0;  // the kernel reported it in that round (epoll_set::round)
};

constexpr std::uint64_t tag_mask = ~std::uint64_t{0xffffffff};
constexpr std::uint64_t member_tag = std::uint64_t{0x766d6d63} << 32;  // "vmmc"
constexpr std::uint64_t wake_tag = std::uint64_t{0x766d6d64} << 32;

bool tagged(std::uint64_t data) {
  const std::uint64_t tag = data & tag_mask;
  return tag == member_tag || tag == wake_tag;
}

}  // namespace

// Outside the anonymous namespace: streams that a set holds refer to it.
struct detail::epoll_set {
  explicit epoll_set(int fd) : epfd(fd) {}
  // A descriptor of the set's epoll instance. The program may dup() it and
  // close the first: closing one of several moves this to another
  // (forget_epoll_set).
  std::atomic<int> epfd;
  int descriptor() const { return epfd.load(std::memory_order_relaxed); }
  std::vector<int> numbers;  // every descriptor of it; under epoll_sets.writer()
  std::mutex mutex;
  std::unordered_map<int, interest> members;
  std::atomic<std::size_t> member_count{0};  // members.size(), read without the lock
  // Descriptors registered with the caller's own event: added less removed
  // (one the program closed without EPOLL_CTL_DEL stays counted).
  std::atomic<std::size_t> kernel_only_members{0};
  int rounds_without_kernel = 0;  // collect(): streams reported without asking the kernel
  std::uint64_t round = 0;        // kernel answers translated so far
};

namespace {
// How a set registers a descriptor. A listener, a descriptor that is no
// stream of ours and a stream on kernel TCP for good: with the caller's
// event, for good. A deferred stream (on kernel TCP until it earns a
// channel, which most short connections never do): with the caller's event
// too, held in the stream, until it upgrades (epoll_members_from_now);
// with EPOLLONESHOT a member at once (registering it again would re-arm
// it). Any other stream, or caller data that looks like a tag: a member.
enum class registration { kernel, held, member };
registration registration_for(const stream* s, const epoll_event& e) {
  if (tagged(e.data.u64)) return registration::member;
  if (!s || s->listening.load()) return registration::kernel;
  if (stash_size(*s) > 0) return registration::member;
  switch (s->state.load()) {
    case phase::plain:
      return registration::kernel;
    case phase::deferred:
      return (e.events & EPOLLONESHOT) ? registration::member : registration::held;
    default:
      return registration::member;
  }
}

void uncount_kernel_only(epoll_set& set) {
  std::size_t n = set.kernel_only_members.load(std::memory_order_relaxed);
  while (n > 0 && !set.kernel_only_members.compare_exchange_weak(n, n - 1)) {
  }
}

// Under the stream's epoll_mutex: the set holds it by `fd` with `user`.
void hold(stream& s, const std::shared_ptr<epoll_set>& set, int fd, const epoll_event& user) {
  auto same = [&](const stream::held_in_set& h) {
    return h.fd == fd && !h.set.owner_before(set) && !set.owner_before(h.set);
  };
  stream::held_in_set* slot = nullptr;
  if (s.held_first.fd < 0 || same(s.held_first) || s.held_first.set.expired()) {
    slot = &s.held_first;
  } else {
    for (auto& h : s.held_more) {
      if (same(h)) {
        slot = &h;
        break;
      }
      if (!slot && h.set.expired()) slot = &h;
    }
    if (!slot) slot = &s.held_more.emplace_back();
  }
  *slot = {set, fd, user};
}

// Never destroyed: the control thread may still close an epoll set while
// the process runs its exit handlers (as the descriptor table, table.cc).
constinit descriptor_map<epoll_set> epoll_sets;

bool may_be_set(int fd) {
  return epoll_sets.may_hold(fd);
}

std::shared_ptr<epoll_set> find_set(int epfd) {
  return epoll_sets.find(epfd);
}

// Under epoll_sets.writer(): `fd` no longer names `set`.
void drop_number_locked(epoll_set& set, int fd) {
  std::erase(set.numbers, fd);
  if (set.descriptor() == fd && !set.numbers.empty())
    set.epfd.store(set.numbers.front(), std::memory_order_relaxed);
}

// Under epoll_sets.writer(): `fd` names `set` from now (a set made, or a
// duplicate of one); a set it named before, closed unseen, loses it.
std::shared_ptr<epoll_set> name_set_locked(int fd, std::shared_ptr<epoll_set> set) {
  if (set) set->numbers.push_back(fd);
  auto before = epoll_sets.exchange_locked(fd, std::move(set));
  if (before) drop_number_locked(*before, fd);
  return before;  // destroyed by the caller, outside the lock
}

int track_set(int epfd) {
  if (epfd < 0) return epfd;
  std::shared_ptr<epoll_set> before;  // a set closed unseen, destroyed outside the lock
  auto set = std::make_shared<epoll_set>(epfd);
  std::lock_guard lock(epoll_sets.writer());
  before = name_set_locked(epfd, std::move(set));
  return epfd;
}

// Changes whenever something new arrived for the stream (edge-triggered).
std::uint64_t activity_of(const stream& s) {
  return s.chan ? s.chan->activity() + s.doorbells_in.load() : 0;
}

std::uint32_t kernel_events_for(stream* s, std::uint32_t user_events) {
  if (!s) return user_events;
  std::uint32_t e = (user_events & ~EPOLLONESHOT) | EPOLLIN;
  const phase p = s->state.load();
  if (p == phase::connecting) e |= EPOLLOUT;  // see kernel_interest()
  if (p == phase::upgraded && s->out.on_channel()) e &= ~EPOLLOUT;
  return e;
}

// Takes the member's wait descriptor out of the set. Only while we hold its
// stream: then the descriptor is open, and its number is not some other
// file's that the caller may have added.
void forget_wait_fd(epoll_set& set, interest& in) {
  if (in.wait_fd >= 0 && in.stream)
    (void)::epoll_ctl(set.descriptor(), EPOLL_CTL_DEL, in.wait_fd, nullptr);
  in.wait_fd = -1;
}

stream* member_stream(epoll_set& set, interest& in) {
  if (in.stream && in.stream->closed.load(std::memory_order_relaxed)) {
    forget_wait_fd(set, in);
    in.stream.reset();
  }
  return in.stream.get();
}

// How a member's sleep will be woken: through its wait descriptor once that
// is in the set (added here, at its first sleep).
redirect::wake_by watch_wait_fd(epoll_set& set, int fd, interest& in, stream& s) {
  const int wait_fd = wait_fd_of(s);
  if (wait_fd < 0) return redirect::wake_by::doorbell;
  if (in.wait_fd != wait_fd) {
    forget_wait_fd(set, in);
    epoll_event e{EPOLLIN | EPOLLET, {}};
    e.data.u64 = wake_tag | static_cast<std::uint32_t>(fd);
    // EEXIST: another member (a duplicate of the descriptor) registered it;
    // it takes it out when it goes, so this one keeps the doorbell.
    if (::epoll_ctl(set.descriptor(), EPOLL_CTL_ADD, wait_fd, &e) != 0)
      return redirect::wake_by::doorbell;
    in.wait_fd = wait_fd;
  }
  return redirect::wake_by::wait_fd;
}

// What to report for member `fd` given the kernel's events for it (0 if
// none); 0 means nothing. Keeps the kernel registration of a stream whose
// writes moved to its channel free of EPOLLOUT (TCP is always writable).
std::uint32_t member_events(epoll_set& set, int fd, interest& in, std::uint32_t kev) {
  if (in.disabled) return 0;
  stream* s = member_stream(set, in);
  if (!s || !needs_us(*s)) return kev & (in.user.events | EPOLLERR | EPOLLHUP);
  std::uint32_t wanted = in.user.events;
  // Edge-triggered: the activity count is taken before readiness is
  // judged, so that what came after the count (and maybe before the
  // judgement) is news for the next wait. Taken after, an echo landing
  // between the two was counted as reported but reported only as EPOLLOUT,
  // and a program that reads on EPOLLIN waited for it for ever.
  const std::uint64_t activity = (wanted & EPOLLET) ? activity_of(*s) : 0;
  auto ev = static_cast<std::uint32_t>(static_cast<std::uint16_t>(
      ready_events(*s, static_cast<short>(wanted & 0xffff), static_cast<short>(kev & 0xffff))));
  ev &= wanted | EPOLLERR | EPOLLHUP;
  if (std::uint32_t k = kernel_events_for(s, wanted); k != in.kernel_events) {
    epoll_event mod{k, {}};
    mod.data.u64 = member_tag | static_cast<std::uint32_t>(fd);
    if (::epoll_ctl(set.descriptor(), EPOLL_CTL_MOD, fd, &mod) == 0) in.kernel_events = mod.events;
  }
  if (ev == 0) return 0;
  if (wanted & EPOLLET) {
    // Edge-triggered: a stream is reported again only when something new
    // came, from the kernel or through its channel.
    if (kev == 0 && activity == in.reported_activity) return 0;
    in.reported_activity = activity;
  }
  return ev;
}

// The kernel's answer (`got` events, in place) as the caller's: members'
// events translated (or dropped: nothing for the caller, or a wait
// descriptor's, which only ends a sleep), the others as the kernel gave
// them. Members reported are marked with `round`. Under the set's lock.
int translate(epoll_set& set, epoll_event* events, int got, std::uint64_t round) {
  int n = 0;
  for (int i = 0; i < got; ++i) {
    const std::uint64_t data = events[i].data.u64;
    if (!tagged(data)) {
      events[n++] = events[i];
      continue;
    }
    if ((data & tag_mask) == wake_tag) continue;
    const int fd = static_cast<int>(static_cast<std::uint32_t>(data));
    auto it = set.members.find(fd);
    if (it == set.members.end()) continue;
    interest& in = it->second;
    in.reported_round = round;
    in.kernel_ready = true;
    if (std::uint32_t ev = member_events(set, fd, in, events[i].events)) {
      events[n].events = ev;
      events[n].data = in.user.data;
      ++n;
      if (in.user.events & EPOLLONESHOT) in.disabled = true;
    }
  }
  return n;
}

// The kernel's wait alone, for a set without members: its answer is the
// caller's but for a member a concurrent epoll_ctl added meanwhile. If
// that leaves nothing of a wait that may have time left, returns nullopt:
// the caller waits our way for what is left.
std::optional<int> wait_in_kernel(epoll_set& set, epoll_event* events, int max_events,
                                  int timeout_ms, const sigset_t* mask) {
  const int got = mask ? ::epoll_pwait(set.descriptor(), events, max_events, timeout_ms, mask)
                       : ::epoll_wait(set.descriptor(), events, max_events, timeout_ms);
  if (got <= 0 ||
      std::none_of(events, events + got, [](const epoll_event& e) { return tagged(e.data.u64); }))
    return got;
  std::lock_guard lock(set.mutex);
  const int n = translate(set, events, got, ++set.round);
  if (n > 0 || timeout_ms == 0) return n;
  return std::nullopt;
}

// epoll_wait and epoll_pwait on a set without members: the kernel's wait,
// atomic with respect to the mask as without us. nullopt: wait our way
// for `timeout_ms`, now what is left.
std::optional<int> wait_without_members(epoll_set& set, epoll_event* events, int max_events,
                                        int& timeout_ms, const sigset_t* mask) {
  if (set.member_count.load(std::memory_order_acquire) != 0) return std::nullopt;
  const auto deadline = deadline_after(timeout_ms);
  if (auto n = wait_in_kernel(set, events, max_events, timeout_ms, mask)) return n;
  timeout_ms = milliseconds_until(deadline);
  if (timeout_ms == 0) return 0;
  return std::nullopt;
}

// One round: first every descriptor the kernel reported (an edge it gave us
// must not be dropped), then our streams whose channels are ready.
// While streams keep being ready, the kernel is asked only every few rounds
// (a busy server then makes no system call per wait); what it holds waits
// that long at most.
int collect(epoll_set& set, epoll_event* events, int max_events, int timeout_ms) {
  int got = 0;
  bool skip_kernel = false;
  {
    std::lock_guard lock(set.mutex);
    skip_kernel = timeout_ms == 0 && set.rounds_without_kernel > 0 && set.rounds_without_kernel < 4;
    if (!skip_kernel) set.rounds_without_kernel = 0;
  }
  if (!skip_kernel) got = ::epoll_wait(set.descriptor(), events, max_events, timeout_ms);
  if (got < 0) return -1;

  std::lock_guard lock(set.mutex);
  const std::uint64_t round = ++set.round;
  int n = translate(set, events, got, round);
  for (auto& [fd, in] : set.members) {
    if (n >= max_events) break;
    if (in.reported_round == round) continue;
    if (!skip_kernel) in.kernel_ready = false;
    stream* s = member_stream(set, in);
    // Before its switch (or its decision) a stream's bytes are the kernel's,
    // and so are those of any member the kernel last found ready: in a
    // round that did not ask the kernel, a level-triggered one asks it alone
    // (its data was not reported again while it lasted).
    const phase p = s ? s->state.load() : phase::plain;
    const bool kernel_bytes =
        skip_kernel && !(in.user.events & EPOLLET) &&
        (in.kernel_ready ||
         (s && (p == phase::undecided || (p == phase::upgraded && !s->in.switched()))));
    if (!kernel_bytes && (!s || (p != phase::upgraded && stash_size(*s) == 0))) continue;
    std::uint32_t kev = 0;
    if (kernel_bytes) {
      // POLLPRI: an urgent answer to our offer is news for ready_events().
      pollfd look{fd, static_cast<short>((in.user.events & 0xffff) | POLLPRI), 0};
      if (::poll(&look, 1, 0) == 1) kev = static_cast<std::uint16_t>(look.revents);
      in.kernel_ready = kev != 0;
    }
    if (std::uint32_t ev = member_events(set, fd, in, kev)) {
      events[n].events = ev;
      events[n].data = in.user.data;
      ++n;
      if (in.user.events & EPOLLONESHOT) in.disabled = true;
    }
  }
  set.rounds_without_kernel = n > 0 ? set.rounds_without_kernel + 1 : 0;
  return n;
}

bool any_channel_member(epoll_set& set) {
  std::lock_guard lock(set.mutex);
  for (auto& [fd, in] : set.members) {
    stream* s = member_stream(set, in);
    if (!in.disabled && s && s->state.load(std::memory_order_relaxed) == phase::upgraded)
      return true;
  }
  return false;
}

// A member only the kernel makes ready (no channel of ours).
bool any_kernel_member(epoll_set& set) {
  std::lock_guard lock(set.mutex);
  if (set.kernel_only_members.load(std::memory_order_relaxed) > 0) return true;
  for (auto& [fd, in] : set.members) {
    stream* s = member_stream(set, in);
    if (!in.disabled && (!s || s->state.load(std::memory_order_relaxed) != phase::upgraded))
      return true;
  }
  return false;
}

bool all_kernel_only(epoll_set& set) {
  std::lock_guard lock(set.mutex);
  for (auto& [fd, in] : set.members) {
    stream* s = member_stream(set, in);
    if (!in.disabled && s && !kernel_only(*s)) return false;
  }
  return true;
}

bool any_stream_ready(epoll_set& set) {
  std::lock_guard lock(set.mutex);
  for (auto& [fd, in] : set.members) {
    if (in.disabled) continue;
    stream* s = member_stream(set, in);
    if (!s || (s->state.load() != phase::upgraded && stash_size(*s) == 0)) continue;
    auto wanted = static_cast<short>(in.user.events & 0xffff);
    const std::uint64_t activity = activity_of(*s);  // before readiness, as member_events
    if (ready_events(*s, wanted, 0) & wanted) {
      if (!(in.user.events & EPOLLET)) return true;
      if (activity != in.reported_activity) return true;
    }
  }
  return false;
}

bool arm_streams(epoll_set& set) {
  std::lock_guard lock(set.mutex);
  for (auto& [fd, in] : set.members) {
    if (in.disabled) continue;
    stream* s = member_stream(set, in);
    if (s && !prepare_sleep(*s, static_cast<short>(in.user.events & 0xffff),
                            watch_wait_fd(set, fd, in, *s)))
      return false;
  }
  return true;
}
}  // namespace

// Called with the stream's setup_mutex held (answer_ask, make_channel):
// takes each set's lock after the stream's epoll_mutex is let go. A wait
// holding a set's lock takes a member's setup_mutex only for one still
// connecting or undecided (ready_events), never for a deferred one, which
// is all this ever promotes: no cycle.
void detail::epoll_members_from_now(stream& s) {
  stream::held_in_set first;
  std::vector<stream::held_in_set> more;
  {
    std::lock_guard lock(s.epoll_mutex);
    first = std::exchange(s.held_first, {});
    more.swap(s.held_more);
  }
  more.push_back(std::move(first));
  for (auto& h : more) {
    auto set = h.set.lock();
    if (!set || h.fd < 0) continue;
    // The descriptor may have been closed, or name another file now.
    stream_ptr same = find(h.fd);
    if (same.get() != &s) continue;
    std::lock_guard lock(set->mutex);
    if (set->members.count(h.fd)) continue;
    epoll_event k{kernel_events_for(&s, h.user.events), {}};
    k.data.u64 = member_tag | static_cast<std::uint32_t>(h.fd);
    set->member_count.store(set->members.size() + 1, std::memory_order_release);
    // Fails if the program took it out of the set (EPOLL_CTL_DEL) meanwhile.
    if (::epoll_ctl(set->descriptor(), EPOLL_CTL_MOD, h.fd, &k) == 0) {
      interest& in = set->members[h.fd];
      in.stream = std::move(same);
      in.user = h.user;
      in.kernel_events = k.events;
      uncount_kernel_only(*set);
    }
    set->member_count.store(set->members.size(), std::memory_order_release);
  }
}

void detail::forget_epoll_set(int fd) {
  if (!may_be_set(fd)) return;
  std::shared_ptr<epoll_set> gone;  // destroyed outside the lock
  std::lock_guard lock(epoll_sets.writer());
  gone = name_set_locked(fd, nullptr);
}

void detail::forget_epoll_sets(unsigned first, unsigned last) {
  std::vector<std::shared_ptr<epoll_set>> gone;  // destroyed outside the lock
  std::lock_guard lock(epoll_sets.writer());
  std::vector<int> in_range;
  epoll_sets.for_each_locked([&](int fd, const std::shared_ptr<epoll_set>&) {
    if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last)
      in_range.push_back(fd);
  });
  for (int fd : in_range) gone.push_back(name_set_locked(fd, nullptr));
}

void detail::duplicated_epoll_set(int fd, int copy) {
  if (copy < 0 || fd == copy || (!may_be_set(fd) && !may_be_set(copy))) return;
  std::shared_ptr<epoll_set> gone;
  std::lock_guard lock(epoll_sets.writer());
  std::shared_ptr<epoll_set> set = epoll_sets.find(fd);
  gone = name_set_locked(copy, std::move(set));
}

int epoll_create(int size) {
  detail::api_call entered;
  return track_set(::epoll_create(size));
}
int epoll_create1(int flags) {
  detail::api_call entered;
  return track_set(::epoll_create1(flags));
}

int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
  detail::api_call entered;
  auto set = find_set(epfd);
  if (!set) return ::epoll_ctl(epfd, op, fd, event);
  stream_ptr s = op == EPOLL_CTL_DEL ? nullptr : find(fd);
  if (set->member_count.load(std::memory_order_acquire) == 0 && (op == EPOLL_CTL_DEL || event)) {
    // A set without members, and a descriptor registered with the caller's
    // event for good (or taken out): the kernel's call, no bookkeeping.
    auto kernel_only = [&] {
      int r = ::epoll_ctl(epfd, op, fd, event);
      if (r == 0 && op == EPOLL_CTL_ADD) set->kernel_only_members.fetch_add(1);
      if (r == 0 && op == EPOLL_CTL_DEL) uncount_kernel_only(*set);
      return r;
    };
    const registration how =
        op == EPOLL_CTL_DEL ? registration::kernel : registration_for(s.get(), *event);
    if (how == registration::kernel) return kernel_only();
    // A deferred stream: the same, and the stream remembers the set (under
    // its lock, so that an upgrade after this finds it). Without members
    // the set has nothing of its own to change.
    if (how == registration::held) {
      std::lock_guard holding(s->epoll_mutex);
      if (registration_for(s.get(), *event) == registration::held &&
          set->member_count.load(std::memory_order_acquire) == 0) {
        int r = kernel_only();
        if (r == 0) hold(*s, set, fd, *event);
        return r;
      }
    }
  }
  std::lock_guard lock(set->mutex);
  auto known = set->members.find(fd);
  const bool was_member = known != set->members.end();
  // Done with the member behind `fd` (if any): its wait descriptor too.
  auto drop_member = [&] {
    if (!was_member) return;
    forget_wait_fd(*set, known->second);
    set->members.erase(known);
    set->member_count.store(set->members.size(), std::memory_order_release);
  };
  if (op == EPOLL_CTL_DEL) {
    int r = ::epoll_ctl(epfd, op, fd, event);
    if (r == 0 && was_member)
      drop_member();
    else if (r == 0)
      uncount_kernel_only(*set);
    return r;
  }
  if (!event) {
    errno = EFAULT;
    return -1;
  }
  registration how = registration_for(s.get(), *event);
  std::unique_lock<std::mutex> holding;
  if (how == registration::held) {
    // Asked again under the stream's lock: an upgrade that comes after this
    // finds the set among those holding the stream.
    holding = std::unique_lock(s->epoll_mutex);
    how = registration_for(s.get(), *event);
  }
  if (how != registration::member) {
    int r = ::epoll_ctl(epfd, op, fd, event);
    if (r == 0 && (op == EPOLL_CTL_ADD || was_member)) set->kernel_only_members.fetch_add(1);
    if (r == 0) drop_member();
    if (r == 0 && how == registration::held) hold(*s, set, fd, *event);
    return r;
  }
  if (holding) holding.unlock();
  epoll_event k{kernel_events_for(s.get(), event->events), {}};
  k.data.u64 = member_tag | static_cast<std::uint32_t>(fd);
  // Counted before the kernel may report it: a wait that finds no member
  // translates anyway what is tagged (wait_in_kernel).
  set->member_count.store(set->members.size() + 1, std::memory_order_release);
  int r = ::epoll_ctl(epfd, op, fd, &k);
  if (r == 0) {
    // Another stream behind the same number (the last one closed unseen)
    // takes its wait descriptor along; the same one keeps it registered.
    int keep_wait_fd = -1;
    if (was_member) {
      if (known->second.stream == s)
        keep_wait_fd = known->second.wait_fd;
      else
        forget_wait_fd(*set, known->second);
    } else if (op == EPOLL_CTL_MOD) {
      uncount_kernel_only(*set);
    }
    interest& in = set->members[fd];
    in = interest{};
    in.wait_fd = keep_wait_fd;
    in.stream = std::move(s);
    in.user = *event;
    in.kernel_events = k.events;
  }
  set->member_count.store(set->members.size(), std::memory_order_release);
  return r;
}

int epoll_wait(int epfd, epoll_event* events, int max_events, int timeout_ms) {
  detail::api_call entered;
  auto set = find_set(epfd);
  if (!set || max_events <= 0) return ::epoll_wait(epfd, events, max_events, timeout_ms);
  if (auto n = wait_without_members(*set, events, max_events, timeout_ms, nullptr)) return *n;
  busy_call busy;
  const bool deciding_only = all_kernel_only(*set);
  return wait_for_readiness(
      timeout_ms, deciding_only, deciding_only || any_kernel_member(*set),
      [&](int ms) { return collect(*set, events, max_events, ms); },
      [&] { return any_stream_ready(*set); }, [&] { return arm_streams(*set); },
      [&] { return any_channel_member(*set); });
}

int epoll_pwait(int epfd, epoll_event* events, int max_events, int timeout_ms,
                const sigset_t* mask) {
  detail::api_call entered;
  auto set = find_set(epfd);
  if (!set || max_events <= 0) return ::epoll_pwait(epfd, events, max_events, timeout_ms, mask);
  if (auto n = wait_without_members(*set, events, max_events, timeout_ms, mask)) return *n;
  sigset_t saved;
  if (mask) ::pthread_sigmask(SIG_SETMASK, mask, &saved);
  int r = vmmc::sockets::epoll_wait(epfd, events, max_events, timeout_ms);
  int e = errno;
  if (mask) ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  errno = e;
  return r;
}

}  // namespace vmmc::sockets
