// fabric_endpoint: one libfabric provider's reliable-datagram endpoint, with
// its completion queue, address vector and registered bounce buffers for
// copied (inline) transfers. Nothing is ever received as a message: data and
// notification records arrive by RMA; records carry remote CQ data.
#include <poll.h>
#include <pthread.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core.h"
#include "libfabric.h"
#include "vmmc/core/memory_monitor.h"
#include "vmmc/core/progress.h"

namespace vmmc::core::detail {

namespace {
constexpr std::size_t bounce_slots = 64;
constexpr int cq_batch = 16;

std::string full_provider_name(const std::string& short_name) {
  if (short_name == "tcp" || short_name == "verbs") return short_name + ";ofi_rxm";
  return short_name;
}

std::error_code fabric_error_code(ssize_t rc) {
  if (rc == -FI_ECONNREFUSED || rc == -FI_ECONNRESET || rc == -FI_ENOTCONN ||
      rc == -FI_EHOSTUNREACH || rc == -FI_ECONNABORTED || rc == -FI_EIO)
    return errc::peer_gone;
  if (rc == -FI_EACCES || rc == -FI_EKEYREJECTED) return errc::permission_denied;
  return errc::fabric_error;
}
// Our own buffers as sources of writes and targets of reads: no remote
// access, and no FI_SEND/FI_RECV, to which rxm adds remote access for its
// rendezvous (issue 13: the bounce slots were readable by anyone).
constexpr std::uint64_t local_access = FI_READ | FI_WRITE;

// Inside fi_cq_read (and rxm's fi_trywait) the provider lands peers' RMA
// writes in our memory (payload, then the ring index after it: FI_ORDER_WAW),
// which another thread polls. That ordering is the provider's and invisible to
// ThreadSanitizer through uninstrumented libfabric, which then reports the
// provider's memcpy against our reader. Its accesses there go unrecorded, as
// libfabric's own are (tests/sanitizers/tsan.supp); no-op in other builds.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
struct provider_writes_unobserved {
  provider_writes_unobserved() { __tsan_ignore_thread_begin(); }
  ~provider_writes_unobserved() { __tsan_ignore_thread_end(); }
};
#else
struct provider_writes_unobserved {};
#endif

// The endpoint's lock, held around its libfabric calls, which are the
// stack's work (descriptors they open are close-on-exec: core.h).
struct fabric_lock {
  fabric_call call;
  std::lock_guard<std::recursive_mutex> lock;
  explicit fabric_lock(std::recursive_mutex& m) : lock(m) {}
};

// libfabric's shm (1.17, util_shm.c: smr_map_to_region) reaches a peer
// endpoint of its own process through that endpoint's region, not through a
// mapping of its own, and the peer's name stays listed after it closed. An
// endpoint that closes first leaves every endpoint of the process that knows
// it a dangling pointer: progress follows it for the commands and responses
// still queued between them (SIGSEGV in fi_cq_read, two contexts of one
// process torn down), a post writes a command through it. Hence this list of
// the process's open shm endpoints (leave_in_process_peers). A fork() child
// starts from an empty one: the parent's endpoints are not its to close.
struct in_process_shm {
  std::mutex mutex;
  std::vector<fabric_endpoint*> open;
};
in_process_shm* in_process = nullptr;  // never destroyed: contexts may end after statics
pthread_once_t in_process_made = PTHREAD_ONCE_INIT;
in_process_shm& in_process_endpoints() {
  ::pthread_once(&in_process_made, [] {
    in_process = new in_process_shm;
    ::pthread_atfork(nullptr, nullptr, [] { new (in_process) in_process_shm; });
  });
  return *in_process;
}

// Quiescing the queues between a closing shm endpoint and its in-process
// peers: a command, then its response, takes one progress call of each side;
// rounds go on while they complete something, within a bound (a peer whose
// commands wait for buffers, SAR, needs more).
constexpr int quiesce_rounds = 4;
constexpr auto quiesce_most = std::chrono::milliseconds(20);
}  // namespace

std::string fabric_endpoint::full_name() const {
  return full_provider_name(short_name_);
}

result<std::unique_ptr<fabric_endpoint>> fabric_endpoint::open(const std::string& short_name,
                                                               const std::string& tcp_address,
                                                               std::size_t inline_max,
                                                               std::size_t utlb_limit,
                                                               remote_write_sink sink) {
  fabric_call call;
  const libfabric::entry_points* lib = libfabric::load();
  if (!lib) return errc::unreachable;
  libfabric::signal_dispositions_kept kept;  // providers start at first use
  std::unique_ptr<fabric_endpoint> e(new fabric_endpoint());
  e->short_name_ = short_name;
  e->sink_ = std::move(sink);
  e->inline_max_ = inline_max;

  fi_info* hints = lib->dupinfo(nullptr);  // fi_allocinfo()
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps =
      FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  // FI_THREAD_SAFE although we serialise our own calls: rxm tears down a
  // connection whose peer died from its control-progress path, and with
  // FI_THREAD_DOMAIN that raced our progress (crashes in fi_cq_read/fi_write
  // seen after killing a peer).
  hints->domain_attr->threading = FI_THREAD_SAFE;
  // Deliberate updates, their notifications and fetches stay in issue order.
  hints->tx_attr->msg_order = FI_ORDER_SAW | FI_ORDER_WAW | FI_ORDER_SAS | FI_ORDER_RAW;
  hints->fabric_attr->prov_name = ::strdup(full_provider_name(short_name).c_str());
  const bool ip_based = short_name != "shm";
  int rc = lib->getinfo(FI_VERSION(1, 17), ip_based ? tcp_address.c_str() : nullptr, nullptr,
                        ip_based ? FI_SOURCE : 0, hints, &e->info_);
  lib->freeinfo(hints);
  if (rc != 0) {
    VMMC_WARN("provider %s unavailable: %s", short_name.c_str(), lib->strerror(-rc));
    return errc::unreachable;
  }
  fi_info* info = e->info_;
  e->virt_addr_ = info->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
  e->prov_key_ = info->domain_attr->mr_mode & FI_MR_PROV_KEY;
  e->local_mr_ = info->domain_attr->mr_mode & FI_MR_LOCAL;
  e->inject_size_ = info->tx_attr->inject_size;
  e->inject_with_context_ = std::strstr(info->fabric_attr->prov_name, "ofi_rxm") != nullptr;
  e->completion_needs_peer_ = short_name == "shm";

  if ((rc = lib->fabric(info->fabric_attr, &e->fabric_, nullptr)) ||
      (rc = fi_domain(e->fabric_, info, &e->domain_, nullptr)))
    return errc::unreachable;
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_UNSPEC;
  if ((rc = fi_av_open(e->domain_, &av_attr, &e->av_, nullptr))) return errc::fabric_error;

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = 1024;
  cq_attr.wait_obj = FI_WAIT_FD;  // lets idle waiters sleep; shm has none
  if (fi_cq_open(e->domain_, &cq_attr, &e->cq_, nullptr) != 0) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((rc = fi_cq_open(e->domain_, &cq_attr, &e->cq_, nullptr))) return errc::fabric_error;
  } else if (fi_control(&e->cq_->fid, FI_GETWAIT, &e->wait_fd_) != 0) {
    e->wait_fd_ = -1;
  }

  if ((rc = fi_endpoint(e->domain_, info, &e->ep_, nullptr)) ||
      (rc = fi_ep_bind(e->ep_, &e->av_->fid, 0)) ||
      (rc = fi_ep_bind(e->ep_, &e->cq_->fid, FI_TRANSMIT | FI_RECV)) || (rc = fi_enable(e->ep_))) {
    VMMC_ERROR("endpoint on %s: %s", short_name.c_str(), lib->strerror(-rc));
    return errc::fabric_error;
  }
  std::size_t name_length = 256;
  e->name_.resize(name_length);
  if (fi_getname(&e->ep_->fid, e->name_.data(), &name_length) != 0) return errc::fabric_error;
  e->name_.resize(name_length);

  // Bounce slots (registered in case the provider wants local descriptors)
  // hold copied sends, notification records and small fetches.
  e->slot_size_ = std::max(inline_max, wire::ring_slot_size);
  e->bounce_pool_.resize(e->slot_size_ * bounce_slots);
  auto bounce = e->register_region(e->bounce_pool_.data(), e->bounce_pool_.size(), local_access);
  if (!bounce) return bounce.error();
  e->bounce_mr_ = *bounce;
  for (int i = bounce_slots - 1; i >= 0; --i) e->free_bounce_.push_back(i);

  // The process-wide monitor (userfaultfd) drops entries whose memory is
  // unmapped or freed; without it (unavailable) the cache still works for
  // memory that outlives its transfers.
  e->utlb_ = std::make_unique<reg_cache>(*e, utlb_limit, memory_monitor::process_wide());
  VMMC_DEBUG("opened %s (mr_mode %#x, inject %zu, wait fd %d)", e->full_name().c_str(),
             info->domain_attr->mr_mode, e->inject_size_, e->wait_fd_);
  if (short_name == "shm") {
    in_process_shm& r = in_process_endpoints();
    std::lock_guard lock(r.mutex);
    r.open.push_back(e.get());
    e->in_process_registered_ = true;
  }
  return e;
}

void fabric_endpoint::leave_in_process_peers() {
  in_process_shm& r = in_process_endpoints();
  // Held throughout: no peer closes meanwhile (its own leaving waits here).
  std::lock_guard registry_lock(r.mutex);
  if (!in_process_registered_) return;
  in_process_registered_ = false;
  std::erase(r.open, this);
  {
    fabric_lock lock(mutex_);
    closing_ = true;  // nothing more of ours gets queued at a peer
  }
  // Every other one may know us: shm maps the sender of a first command
  // itself (a connection request), with no address vector entry.
  if (r.open.empty()) return;
  const auto until = clock::now() + quiesce_most;
  for (int round = 0;; ++round) {
    std::size_t handled = progress();
    for (fabric_endpoint* other : r.open) handled += other->progress();
    if ((round + 1 >= quiesce_rounds && handled == 0) || clock::now() >= until) break;
  }
  // Those that inserted our name forget it while our region is still there
  // (a removal writes into the peer's region in some versions); their posts
  // to it fail from now on.
  for (fabric_endpoint* other : r.open) {
    fabric_lock lock(other->mutex_);
    for (const auto& [name, address] : other->inserted_) {
      if (name != name_) continue;
      fi_addr_t a = address;
      fi_av_remove(other->av_, &a, 1, 0);
      other->gone_peers_.push_back(address);
    }
    std::erase_if(other->inserted_, [&](const auto& entry) { return entry.first == name_; });
  }
}

fabric_endpoint::~fabric_endpoint() {
  leave_in_process_peers();
  fabric_call call;
  if (ep_) fi_close(&ep_->fid);
  in_flight_.clear();  // operations a dead peer never completed hold leases
  utlb_.reset();       // deregisters cached local registrations
  if (bounce_mr_) fi_close(&bounce_mr_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (av_) fi_close(&av_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) libfabric::load()->freeinfo(info_);
}

result<fi_addr_t> fabric_endpoint::insert_peer(const std::vector<std::uint8_t>& address) {
  fabric_lock lock(mutex_);
  fi_addr_t a = FI_ADDR_NOTAVAIL;
  if (fi_av_insert(av_, address.data(), 1, &a, 0, nullptr) != 1) return errc::unreachable;
  std::erase(gone_peers_, a);  // the vector reuses a removed address
  if (short_name_ == "shm") inserted_.emplace_back(address, a);
  return a;
}

// Every registration gets a random 64-bit key where the provider takes ours
// (mr_mode without FI_MR_PROV_KEY, as tcp and shm here): a peer that can
// reach our endpoint, importer or not, cannot guess one. Counting keys from
// 1 let a plain libfabric program read and write any export at offset 0.
result<fid_mr*> fabric_endpoint::register_region(const void* base, std::size_t length,
                                                 std::uint64_t access) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::uint64_t key = 0;
    if (!prov_key_ && ::getrandom(&key, sizeof key, 0) != sizeof key) return errc::fabric_error;
    fid_mr* mr = nullptr;
    int rc = fi_mr_reg(domain_, base, length, access, 0, key, 0, &mr, nullptr);
    if (rc == 0) return mr;
    if (rc != -FI_ENOKEY || prov_key_) break;  // else that key is taken: draw again
  }
  return errc::fabric_error;
}

result<fabric_mr> fabric_endpoint::register_export(void* base, std::size_t length, rights allowed) {
  std::uint64_t access = 0;
  if (has_right(allowed, rights::write)) access |= FI_REMOTE_WRITE;
  if (has_right(allowed, rights::read)) access |= FI_REMOTE_READ;
  fabric_mr m;
  m.endpoint = this;
  fabric_lock lock(mutex_);
  auto mr = register_region(base, length, access);
  if (!mr) return mr.error();
  m.mr = *mr;
  m.key = fi_mr_key(m.mr);
  m.remote_address = virt_addr_ ? reinterpret_cast<std::uint64_t>(base) : 0;
  return m;
}

void fabric_endpoint::deregister_export(fabric_mr& m) {
  fabric_lock lock(mutex_);
  if (m.mr) fi_close(&m.mr->fid);
  m.mr = nullptr;
}

result<registration> fabric_endpoint::register_memory(const void* address, std::size_t length) {
  fabric_lock lock(mutex_);
  auto mr = register_region(address, length, local_access);
  if (!mr) return errc::resource_exhausted;
  return registration{fi_mr_desc(*mr), reinterpret_cast<std::uint64_t>(*mr)};
}

void fabric_endpoint::deregister_memory(const registration& r) {
  fabric_lock lock(mutex_);
  fi_close(&reinterpret_cast<fid_mr*>(r.token)->fid);
}

void fabric_endpoint::begin(const std::shared_ptr<op>& o) {
  o->parts.store(1, std::memory_order_relaxed);  // the posting guard
  fabric_lock lock(mutex_);
  in_flight_.emplace(o.get(), o);
}

void fabric_endpoint::abandon(op& o) {
  fabric_lock lock(mutex_);
  o.abandoned = true;
}

void fabric_endpoint::finish_posting(const std::shared_ptr<op>& o, std::error_code error) {
  fabric_lock lock(mutex_);
  complete(o.get(), error);
}

// The send queue drains as the peer progresses: nothing to sleep on, so a
// waiter that has spun yields the core at every turn.
template <class Post>
status fabric_endpoint::post_retrying(fi_addr_t peer, Post&& post,
                                      const std::atomic<bool>& peer_alive) {
  status outcome;
  auto posted = [&] {
    {
      fabric_lock lock(mutex_);
      if (gone_locked(peer)) {
        outcome = errc::peer_gone;
        return true;
      }
      ssize_t rc = post();
      if (rc != -FI_EAGAIN) {
        if (rc != 0) outcome = fabric_error_code(rc);
        return true;
      }
      progress_locked();
    }
    if (peer_alive.load(std::memory_order_acquire)) return false;
    outcome = errc::peer_gone;
    return true;
  };
  (void)wait_until(posted, clock::time_point::max(), napping(std::chrono::nanoseconds::zero()));
  return outcome;
}

int fabric_endpoint::take_bounce_slot(const std::atomic<bool>& peer_alive) {
  int slot = -1;
  auto taken = [&] {
    fabric_lock lock(mutex_);
    if (!free_bounce_.empty()) {
      slot = free_bounce_.back();
      free_bounce_.pop_back();
      return true;
    }
    progress_locked();
    return !peer_alive.load(std::memory_order_acquire);
  };
  (void)wait_until(taken, clock::time_point::max(), napping(std::chrono::nanoseconds::zero()));
  return slot;
}

void fabric_endpoint::give_bounce_slot(int slot) {
  free_bounce_.push_back(slot);
}

// Over ofi_rxm (libfabric 1.17) an fi_inject_write still queued when its
// connection breaks comes back as an error completion with a null context,
// and rxm dereferences it (SIGSEGV in fi_cq_read, seen when a peer is
// killed). There we post with FI_INJECT | FI_COMPLETION: the provider still
// copies the source before returning, and every completion carries a context
// (at a cost: 64-byte streaming over tcp halves). Other providers inject.
// The context is one marker for all of them: an inject is done when the
// post returns, and a failed one is its peer's failure, which the peer's
// control connection reports.
status fabric_endpoint::inject_write(fi_addr_t peer, const void* source, std::size_t length,
                                     std::uint64_t remote_address, std::uint64_t key,
                                     const std::atomic<bool>& peer_alive) {
  if (!inject_with_context_)
    return post_retrying(
        peer, [&] { return fi_inject_write(ep_, source, length, peer, remote_address, key); },
        peer_alive);
  iovec iov{const_cast<void*>(source), length};
  fi_rma_iov rma{remote_address, length, key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.iov_count = 1;
  msg.addr = peer;
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = &inject_marker_;
  return post_retrying(
      peer, [&] { return fi_writemsg(ep_, &msg, FI_INJECT | FI_COMPLETION); }, peer_alive);
}

// A part of `o` that owns bounce slot `slot` and completes into `o`.
std::shared_ptr<op> fabric_endpoint::start_part(const std::shared_ptr<op>& o, int slot) {
  auto part = std::make_shared<op>();
  part->bounce_slot = slot;
  part->parent = o;
  o->parts.fetch_add(1, std::memory_order_relaxed);
  part->parts.store(1, std::memory_order_relaxed);
  fabric_lock lock(mutex_);
  in_flight_.emplace(part.get(), part);
  return part;
}

// Copies through registered bounce slots, one op part per slot, so that any
// number of chunks can belong to one op: small transfers, and large ones the
// UTLB cannot register (over its limit).
status fabric_endpoint::post_bounced(const std::shared_ptr<op>& o, bool is_write, fi_addr_t peer,
                                     std::byte* local, std::size_t length,
                                     std::uint64_t remote_address, std::uint64_t key,
                                     const std::atomic<bool>& peer_alive,
                                     std::optional<std::uint64_t> immediate) {
  for (std::size_t done = 0; done < length;) {
    // Whole slots: a record (at most wire::ring_slot_size <= slot_size_)
    // must travel as one write, since its immediate data names it once.
    const std::size_t chunk = std::min(slot_size_, length - done);
    int slot = take_bounce_slot(peer_alive);
    if (slot < 0) return errc::peer_gone;
    std::byte* bounce = bounce_pool_.data() + static_cast<std::size_t>(slot) * slot_size_;
    auto part = start_part(o, slot);
    if (is_write) {
      std::memcpy(bounce, local + done, chunk);
    } else {
      part->copy_to = local + done;
      part->copy_length = chunk;
    }
    const std::uint64_t at = remote_address + done;
    status s = post_retrying(
        peer,
        [&] {
          void* desc = fi_mr_desc(bounce_mr_);
          if (!is_write) return fi_read(ep_, bounce, chunk, desc, peer, at, key, part.get());
          if (immediate)
            return fi_writedata(ep_, bounce, chunk, desc, *immediate, peer, at, key, part.get());
          return fi_write(ep_, bounce, chunk, desc, peer, at, key, part.get());
        },
        peer_alive);
    if (!s) {
      fabric_lock lock(mutex_);
      complete(part.get(), s.error());
      return s;
    }
    done += chunk;
  }
  return {};
}

status fabric_endpoint::post_write(const std::shared_ptr<op>& o, fi_addr_t peer, const void* source,
                                   std::size_t length, std::uint64_t remote_address,
                                   std::uint64_t key, const std::atomic<bool>& peer_alive,
                                   bool may_inject) {
  if (may_inject && length <= inject_size_)
    return inject_write(peer, source, length, remote_address, key, peer_alive);
  return post_rma(o, true, peer, static_cast<std::byte*>(const_cast<void*>(source)), length,
                  remote_address, key, peer_alive);
}

status fabric_endpoint::post_read(const std::shared_ptr<op>& o, fi_addr_t peer, void* destination,
                                  std::size_t length, std::uint64_t remote_address,
                                  std::uint64_t key, const std::atomic<bool>& peer_alive) {
  return post_rma(o, false, peer, static_cast<std::byte*>(destination), length, remote_address, key,
                  peer_alive);
}

status fabric_endpoint::post_rma(const std::shared_ptr<op>& o, bool is_write, fi_addr_t peer,
                                 std::byte* local, std::size_t length, std::uint64_t remote_address,
                                 std::uint64_t key, const std::atomic<bool>& peer_alive) {
  if (length <= inline_max_)
    return post_bounced(o, is_write, peer, local, length, remote_address, key, peer_alive);
  auto lease = utlb_->acquire(local, length);
  if (lease.is(errc::resource_exhausted))
    return post_bounced(o, is_write, peer, local, length, remote_address, key, peer_alive);
  if (!lease) return lease.error();
  // Zero copy: the caller's memory, registered through the UTLB.
  void* desc = lease->descriptor();
  o->lease.emplace(std::move(*lease));
  o->zero_copy = true;
  o->lands_in_caller |= !is_write;
  o->parts.fetch_add(1, std::memory_order_relaxed);
  status s = post_retrying(
      peer,
      [&] {
        return is_write ? fi_write(ep_, local, length, desc, peer, remote_address, key, o.get())
                        : fi_read(ep_, local, length, desc, peer, remote_address, key, o.get());
      },
      peer_alive);
  if (!s) {
    fabric_lock lock(mutex_);
    complete(o.get(), s.error());
  }
  return s;
}

status fabric_endpoint::post_write_with_data(const std::shared_ptr<op>& o, fi_addr_t peer,
                                             const void* source, std::size_t length,
                                             std::uint64_t remote_address, std::uint64_t key,
                                             std::uint64_t immediate,
                                             const std::atomic<bool>& peer_alive) {
  if (length <= inject_size_)
    return post_retrying(
        peer,
        [&] {
          return fi_inject_writedata(ep_, source, length, immediate, peer, remote_address, key);
        },
        peer_alive);
  // One bounce slot (see post_bounced).
  return post_bounced(o, true, peer, static_cast<std::byte*>(const_cast<void*>(source)), length,
                      remote_address, key, peer_alive, immediate);
}

// Called with mutex_ held.
void fabric_endpoint::complete(op* o, std::error_code error) {
  if (error && !o->error) o->error = error;
  if (o->parts.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (o->bounce_slot >= 0) {
    const bool waiter_gone = o->abandoned || (o->parent && o->parent->abandoned);
    if (o->copy_to && !o->error && !waiter_gone)
      std::memcpy(o->copy_to,
                  bounce_pool_.data() + static_cast<std::size_t>(o->bounce_slot) * slot_size_,
                  o->copy_length);
    give_bounce_slot(o->bounce_slot);
    o->bounce_slot = -1;
  }
  o->lease.reset();
  std::shared_ptr<op> keep = std::move(in_flight_[o]);
  in_flight_.erase(o);
  if (auto parent = std::move(o->parent)) {
    complete(parent.get(), o->error);
    return;
  }
  if (o->import) o->import->in_flight.fetch_sub(1, std::memory_order_acq_rel);
  o->done.store(true, std::memory_order_release);
}

std::size_t fabric_endpoint::progress_locked() {
  fi_cq_data_entry entries[cq_batch];
  std::size_t handled = 0;
  for (;;) {
    ssize_t n;
    {
      [[maybe_unused]] provider_writes_unobserved unobserved;
      n = fi_cq_read(cq_, entries, cq_batch);
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) != 1) break;
      if (err.op_context) {
        VMMC_WARN("%s completion error: %s", short_name_.c_str(),
                  fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0));
        if (err.op_context != &inject_marker_)
          complete(static_cast<op*>(err.op_context), fabric_error_code(-err.err));
      }
      ++handled;
      continue;
    }
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& e = entries[i];
      if (e.flags & FI_REMOTE_CQ_DATA)
        sink_(e.data);  // a notification record landed in one of our rings
      else if (e.op_context && e.op_context != &inject_marker_)
        complete(static_cast<op*>(e.op_context), {});
    }
    handled += static_cast<std::size_t>(n);
  }
  return handled;
}

std::size_t fabric_endpoint::progress() {
  fabric_lock lock(mutex_);
  return progress_locked();
}

std::size_t fabric_endpoint::try_progress() {
  fabric_call call;
  std::unique_lock lock(mutex_, std::try_to_lock);
  return lock.owns_lock() ? progress_locked() : 0;
}

bool fabric_endpoint::try_arm_wait() {
  if (wait_fd_ < 0) return false;
  fid* fids[1] = {&cq_->fid};
  fabric_lock lock(mutex_);
  [[maybe_unused]] provider_writes_unobserved unobserved;  // rxm progresses in it
  return fi_trywait(fabric_, fids, 1) == FI_SUCCESS;
}

void fabric_endpoint::sleep_for_completions(std::chrono::microseconds timeout) {
  if (wait_fd_ >= 0) {
    if (!try_arm_wait()) return;  // something is ready
    pollfd p{wait_fd_, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(1, timeout.count() / 1000)));
    return;
  }
  // No wait object (shm): nap briefly; the caller bounds the total.
  std::this_thread::sleep_for(std::min(timeout, std::chrono::microseconds(50)));
}

}  // namespace vmmc::core::detail

namespace vmmc::core {
bool opening_for_the_stack() noexcept {
  return detail::stack_work_depth > 0;
}
}  // namespace vmmc::core
