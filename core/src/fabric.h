// One libfabric provider's endpoint (fabric_endpoint, fabric.cc) and the
// operations posted on it.
#pragma once

#include <rdma/fabric.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "vmmc/core/context.h"
#include "vmmc/core/reg_cache.h"

namespace vmmc::core::detail {

class fabric_endpoint;

// How deep this thread is in work for the stack: a fabric_call around each
// libfabric call, and one for the whole life of the control thread, which
// opens nothing for the program. See opening_for_the_stack().
inline thread_local int stack_work_depth = 0;
class fabric_call {
 public:
  fabric_call() noexcept { ++stack_work_depth; }
  ~fabric_call() { --stack_work_depth; }
  fabric_call(const fabric_call&) = delete;
  fabric_call& operator=(const fabric_call&) = delete;
};
inline void one_of_the_stacks_threads() noexcept {
  ++stack_work_depth;
}

// One posted operation (or a group of posts, such as a write and its record).
// Shared between the request table and the endpoint's in-flight set; libfabric
// gets a raw pointer as its context and the endpoint keeps it alive until
// every part has completed, even if the caller gave up because the peer died.
struct op {
  void* user_context = nullptr;
  std::atomic<int> parts{0};  // posts still outstanding
  std::atomic<bool> done{false};
  std::error_code error;  // first error, written before done
  std::shared_ptr<struct import_entry> import;
  std::optional<reg_cache::lease> lease;
  bool zero_copy = false;        // a post reads or writes the caller's memory directly
  bool lands_in_caller = false;  // a zero-copy read: the provider writes it
  int bounce_slot = -1;
  void* copy_to = nullptr;  // small fetches land in a bounce slot first
  std::size_t copy_length = 0;
  std::shared_ptr<op> parent;  // a bounce-slot part completes into its op
  // Its waiter gave up (the peer is gone) and returned: a part completing
  // later must not copy into the caller's memory. Under the endpoint lock.
  bool abandoned = false;
};

struct fabric_mr {
  fabric_endpoint* endpoint = nullptr;
  struct fid_mr* mr = nullptr;
  std::uint64_t key = 0;
  std::uint64_t remote_address = 0;  // address an importer writes for offset 0
};

// Receives the immediate data of remote writes that carry it (notification
// records), during progress, with the endpoint lock held.
using remote_write_sink = std::function<void(std::uint64_t immediate)>;

class fabric_endpoint final : public registrar {
 public:
  static result<std::unique_ptr<fabric_endpoint>> open(const std::string& short_name,
                                                       const std::string& tcp_address,
                                                       std::size_t inline_max,
                                                       std::size_t utlb_limit,
                                                       remote_write_sink sink);
  ~fabric_endpoint() override;

  const std::string& short_name() const { return short_name_; }  // "shm", "tcp", ...
  std::string full_name() const;                                 // "tcp;ofi_rxm"
  bool has_wait_fd() const { return wait_fd_ >= 0; }
  // Set once a fabric import uses this endpoint (either end). Endpoints never
  // used are not progressed: a tcp progress call costs system calls.
  void mark_in_use() { in_use_.store(true, std::memory_order_relaxed); }
  bool in_use() const { return in_use_.load(std::memory_order_relaxed); }
  int wait_fd() const { return wait_fd_; }
  const std::vector<std::uint8_t>& name() const { return name_; }
  std::size_t inline_max() const { return inline_max_; }
  std::size_t inject_size() const { return inject_size_; }
  bool completion_needs_peer() const { return completion_needs_peer_; }

  result<fi_addr_t> insert_peer(const std::vector<std::uint8_t>& address);

  // Before an shm endpoint closes, the endpoints of this process that know
  // it finish what is queued between them and it, then forget it; posts to
  // it fail peer_gone from then on (fabric.cc says why). Called by the
  // context while its state is whole (progress lands notifications and
  // completes ops); the destructor calls it too, and a second call does
  // nothing.
  void leave_in_process_peers();

  result<fabric_mr> register_export(void* base, std::size_t length, rights allowed);
  void deregister_export(fabric_mr& mr);

  // A write of at most inject_size() bytes, copied by the provider before
  // it returns; its completion only releases internal tracking.
  status inject_write(fi_addr_t peer, const void* source, std::size_t length,
                      std::uint64_t remote_address, std::uint64_t key,
                      const std::atomic<bool>& peer_alive);

  // An op's life on this endpoint: begin() registers it with a posting guard,
  // posts add parts, finish_posting() drops the guard (recording `error`).
  void begin(const std::shared_ptr<op>& o);
  // The waiter of `o` returns before it completed: nothing of it lands in
  // the caller's memory from now on (zero-copy reads excepted: see wait_op).
  void abandon(op& o);
  void finish_posting(const std::shared_ptr<op>& o, std::error_code error);

  // Posts; each adds one part to `o` which completes through progress().
  // Small writes are injected or bounced; large ones go zero-copy through the
  // UTLB. Returns would_block never: it drives progress itself until posted.
  // `may_inject` false: always a tracked post, whose completion says the data
  // left this process (an injected write reports no completion).
  status post_write(const std::shared_ptr<op>& o, fi_addr_t peer, const void* source,
                    std::size_t length, std::uint64_t remote_address, std::uint64_t key,
                    const std::atomic<bool>& peer_alive, bool may_inject = true);
  status post_read(const std::shared_ptr<op>& o, fi_addr_t peer, void* destination,
                   std::size_t length, std::uint64_t remote_address, std::uint64_t key,
                   const std::atomic<bool>& peer_alive);
  // Writes `length` bytes (a notification record) with remote CQ data.
  status post_write_with_data(const std::shared_ptr<op>& o, fi_addr_t peer, const void* source,
                              std::size_t length, std::uint64_t remote_address, std::uint64_t key,
                              std::uint64_t immediate, const std::atomic<bool>& peer_alive);

  // Reads completions; progress() blocks for the lock, try_progress() skips
  // when another thread is already progressing. Returns completions handled.
  std::size_t progress();
  std::size_t try_progress();
  // Sleeps up to `timeout` for completions (wait fd when the provider has
  // one, else a short nap).
  void sleep_for_completions(std::chrono::microseconds timeout);
  // fi_trywait: true when sleeping on wait_fd() is safe (nothing pending).
  bool try_arm_wait();

  reg_cache& utlb() { return *utlb_; }

  // registrar (for the UTLB)
  result<registration> register_memory(const void* address, std::size_t length) override;
  // Under mutex_ (but at open): a registration with an unguessable key.
  result<struct fid_mr*> register_region(const void* base, std::size_t length,
                                         std::uint64_t access);
  void deregister_memory(const registration& r) override;

 private:
  fabric_endpoint() = default;
  std::size_t progress_locked();
  void complete(op* o, std::error_code error);
  // Posts with -FI_EAGAIN handling: drives progress and retries.
  template <class Post>
  status post_retrying(fi_addr_t peer, Post&& post, const std::atomic<bool>& peer_alive);
  // An in-process peer that closed (leave_in_process_peers): under mutex_.
  bool gone_locked(fi_addr_t peer) const {
    return closing_ ||
           (!gone_peers_.empty() && std::ranges::find(gone_peers_, peer) != gone_peers_.end());
  }
  // A read or write: copied through bounce slots up to inline_max (or when
  // the UTLB cannot register it), else zero-copy from the caller's memory.
  status post_rma(const std::shared_ptr<op>& o, bool is_write, fi_addr_t peer, std::byte* local,
                  std::size_t length, std::uint64_t remote_address, std::uint64_t key,
                  const std::atomic<bool>& peer_alive);
  // Writes carry `immediate` as remote CQ data when it is set.
  status post_bounced(const std::shared_ptr<op>& o, bool is_write, fi_addr_t peer, std::byte* local,
                      std::size_t length, std::uint64_t remote_address, std::uint64_t key,
                      const std::atomic<bool>& peer_alive,
                      std::optional<std::uint64_t> immediate = std::nullopt);
  std::shared_ptr<op> start_part(const std::shared_ptr<op>& o, int slot);
  int take_bounce_slot(const std::atomic<bool>& peer_alive);
  void give_bounce_slot(int slot);

  std::string short_name_;
  struct fi_info* info_ = nullptr;
  struct fid_fabric* fabric_ = nullptr;
  struct fid_domain* domain_ = nullptr;
  struct fid_av* av_ = nullptr;
  struct fid_cq* cq_ = nullptr;
  struct fid_ep* ep_ = nullptr;
  int wait_fd_ = -1;
  std::vector<std::uint8_t> name_;
  bool virt_addr_ = false;
  bool prov_key_ = false;
  bool local_mr_ = false;
  bool inject_with_context_ = false;  // see inject_write()
  // The context every such inject carries: nothing waits for it, so it
  // needs no op of its own (no allocation, no in-flight entry per write).
  op inject_marker_;
  // shm's large writes are pulled by the target (CMA or its SAR buffers):
  // their completion waits for the target process to progress.
  bool completion_needs_peer_ = false;
  std::atomic<bool> in_use_{false};
  std::size_t inject_size_ = 0;
  std::size_t inline_max_ = 0;
  remote_write_sink sink_;

  // Every libfabric call on this endpoint and its domain.
  // Recursive: a completion releases a UTLB lease, which may deregister
  // memory (fi_close on an MR) from inside progress.
  std::recursive_mutex mutex_;
  std::unordered_map<op*, std::shared_ptr<op>> in_flight_;
  // shm only, under mutex_: each address inserted and what it became, and
  // the addresses of in-process peers that closed first.
  std::vector<std::pair<std::vector<std::uint8_t>, fi_addr_t>> inserted_;
  std::vector<fi_addr_t> gone_peers_;
  bool in_process_registered_ = false;  // under the process's registry lock
  bool closing_ = false;                // left its in-process peers: posts nothing more

  // Bounce buffers for copied (inline) sends, records and small fetches.
  std::size_t slot_size_ = 0;
  std::vector<std::byte> bounce_pool_;
  struct fid_mr* bounce_mr_ = nullptr;
  std::vector<int> free_bounce_;

  std::unique_ptr<reg_cache> utlb_;
};

}  // namespace vmmc::core::detail
