// core/src/fabric_side.h: where peers reach a context, and the fabric that
// carries the remote ones (fabric_side.cc).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "address.h"
#include "fabric.h"
#include "unique_fd.h"

namespace vmmc::core::detail {

// A context's address and its fabric side: the providers' endpoints and
// the TCP control listener remote peers reach it by. The identity (host,
// process, user, nonce, secret) is fixed at start. The fabric opens at
// start, or when a peer first needs it (open), and stays as it is from
// then until the context ends; the address names it from then on. Its own
// locks, under which nothing else is taken.
class fabric_side {
 public:
  struct plan {
    std::vector<std::string> providers;
    std::string tcp_address;    // VMMC_CORE_TCP_ADDRESS
    std::string local_address;  // context_options::local_address
    std::size_t inline_max = 0, utlb_limit = 0;
  };
  using endpoint_list = std::vector<std::unique_ptr<fabric_endpoint>>;

  // Before any other call, and before another thread can make one.
  void start(plan how, peer_address identity, remote_write_sink sink);
  // Host, pid, uid, nonce and secret: fixed at start, read without a lock.
  // (Its fabric names are in blob() once open.)
  const peer_address& identity() const noexcept { return identity_; }

  // Opens the providers, once: later calls say how that went.
  // `local_address` (an IPv4 address of ours) says where remote peers reach
  // us when no setting does.
  status open(std::string_view local_address = {});
  bool is_open() const noexcept { return open_.load(std::memory_order_acquire) != nullptr; }
  const endpoint_list& endpoints() const noexcept;
  int tcp_listener() const noexcept;  // -1 while closed, or with no remote provider

  std::string blob() const;                 // the public address (a hello's)
  std::string address_with_secret() const;  // what the context hands out

  // At the context's end, once nothing uses the endpoints any more.
  void close();

 private:
  struct paths {
    endpoint_list endpoints;
    unique_fd tcp_listener;
  };
  plan plan_;
  remote_write_sink sink_;
  peer_address identity_;

  mutable std::mutex address_mutex_;
  peer_address reached_at_;  // identity_ and, once open, the fabric names
  std::string blob_;         // encode_address(reached_at_)

  std::mutex open_mutex_;  // serialises open()
  bool tried_ = false;
  std::unique_ptr<paths> owned_;
  std::atomic<const paths*> open_{nullptr};  // published once open
};

}  // namespace vmmc::core::detail
