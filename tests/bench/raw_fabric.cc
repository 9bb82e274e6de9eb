// tests/bench/raw_fabric.cc: a minimal raw libfabric RDM endpoint and the
// reference experiments built on it (see raw_fabric.h).
//
// One endpoint per process, one completion queue for both directions,
// busy-polled: shm has FI_PROGRESS_MANUAL and no CQ wait object, and a
// benchmark wants the lowest latency anyway (one busy thread per process, two
// processes: the two cores of the reference machine).
#include "raw_fabric.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "bench_common.h"

namespace vmmc::bench::raw {

namespace {

[[noreturn]] void fail(const std::string& what, long rc) {
  throw std::runtime_error(what + ": " + fi_strerror(static_cast<int>(-rc)) + " (" +
                           std::to_string(rc) + ")");
}

// A wait on the fabric that takes this long means the peer is gone or a
// protocol step was lost: fail instead of hanging.
constexpr auto wait_limit = std::chrono::seconds(20);

// Where a peer's registered buffer is, as the writer must name it.
struct remote_buffer {
  std::uint64_t addr;  // virtual address (FI_MR_VIRT_ADDR) or 0 (offset addressing)
  std::uint64_t key;
  std::uint64_t size;
};

struct local_buffer {
  char* data = nullptr;
  std::size_t size = 0;
  fid_mr* mr = nullptr;
  void* desc = nullptr;  // for FI_MR_LOCAL
  remote_buffer self{};  // what the peer needs to write into it
};

// Control messages closing the phases of a streaming run.
enum control : std::uint64_t { control_go = 1, control_done = 2, control_fin = 3 };

class raw_endpoint {
 public:
  explicit raw_endpoint(const std::string& short_provider) {
    const std::string prov = fabric_provider_name(short_provider);
    fi_info* hints = fi_allocinfo();
    if (!hints) throw std::runtime_error("fi_allocinfo failed");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = 0;  // we supply no per-operation fi_context
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAW | FI_ORDER_WAW | FI_ORDER_SAS;
    hints->fabric_attr->prov_name = strdup(prov.c_str());
    // tcp needs a local address; port 0 lets the listener pick one.
    const char* node = short_provider == "tcp" ? this_host_address().c_str() : nullptr;
    const int rc =
        fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints, &info_);
    fi_freeinfo(hints);
    if (rc) fail("fi_getinfo(" + prov + ")", rc);

    check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
    check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_attr.size = info_->tx_attr->size + info_->rx_attr->size;
    check(fi_cq_open(domain_, &cq_attr, &cq_, nullptr), "fi_cq_open");
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    check(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
    check(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
    check(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
    check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    check(fi_enable(ep_), "fi_enable");
  }

  ~raw_endpoint() {
    for (auto& b : buffers_) {
      if (b->mr) fi_close(&b->mr->fid);
    }
    if (ep_) fi_close(&ep_->fid);
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
    for (auto& b : buffers_) std::free(b->data);
  }

  raw_endpoint(const raw_endpoint&) = delete;
  raw_endpoint& operator=(const raw_endpoint&) = delete;

  const fi_info& info() const { return *info_; }
  std::size_t inject_size() const { return info_->tx_attr->inject_size; }

  // Exchanges fi_getname addresses over the link and inserts the peer.
  void connect(peer_link& link) {
    char name[256];
    std::size_t length = sizeof name;
    check(fi_getname(&ep_->fid, name, &length), "fi_getname");
    link.send(std::string_view(name, length));
    const std::string peer_name = link.recv();
    const int n = fi_av_insert(av_, peer_name.data(), 1, &peer_, 0, nullptr);
    if (n != 1) fail("fi_av_insert", n < 0 ? n : -FI_EINVAL);
  }

  // Allocates and registers a page-aligned buffer for local and remote access.
  local_buffer& allocate(std::size_t size) {
    auto b = std::make_unique<local_buffer>();
    const std::size_t rounded = (std::max<std::size_t>(size, 1) + 4095) / 4096 * 4096;
    b->data = static_cast<char*>(std::aligned_alloc(4096, rounded));
    if (!b->data) throw std::bad_alloc();
    std::memset(b->data, 0x5a, rounded);
    b->size = size;
    const bool prov_key = info_->domain_attr->mr_mode & FI_MR_PROV_KEY;
    const std::uint64_t requested_key = prov_key ? 0 : next_key_++;
    check(fi_mr_reg(domain_, b->data, rounded,
                    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                    requested_key, 0, &b->mr, nullptr),
          "fi_mr_reg");
    b->desc = fi_mr_desc(b->mr);
    const bool virt_addr = info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
    b->self.addr = virt_addr ? reinterpret_cast<std::uint64_t>(b->data) : 0;
    b->self.key = fi_mr_key(b->mr);
    b->self.size = size;
    buffers_.push_back(std::move(b));
    return *buffers_.back();
  }

  // Sends our buffer's descriptor and returns the peer's.
  static remote_buffer exchange(peer_link& link, const local_buffer& mine) {
    link.send_value(mine.self);
    return link.recv_value<remote_buffer>();
  }

  // ---- posting; -FI_EAGAIN means "drive progress, then retry"

  void write(const local_buffer& src, std::size_t size, const remote_buffer& dst) {
    post([&] { return fi_write(ep_, src.data, size, src.desc, peer_, dst.addr, dst.key, nullptr); },
         "fi_write");
    ++tx_posted_;
  }

  void inject_write(const local_buffer& src, std::size_t size, const remote_buffer& dst) {
    post([&] { return fi_inject_write(ep_, src.data, size, peer_, dst.addr, dst.key); },
         "fi_inject_write");
  }

  // A write that produces a completion with `data` at the peer; injected when small.
  void write_data(const local_buffer& src, std::size_t size, const remote_buffer& dst,
                  std::uint64_t data) {
    if (size <= inject_size()) {
      post([&] { return fi_inject_writedata(ep_, src.data, size, data, peer_, dst.addr, dst.key); },
           "fi_inject_writedata");
    } else {
      post(
          [&] {
            return fi_writedata(ep_, src.data, size, src.desc, data, peer_, dst.addr, dst.key,
                                nullptr);
          },
          "fi_writedata");
      ++tx_posted_;
    }
  }

  // A message; injected when small.
  void send(const void* data, std::size_t size, void* desc) {
    if (size <= inject_size()) {
      post([&] { return fi_inject(ep_, data, size, peer_); }, "fi_inject");
    } else {
      post([&] { return fi_send(ep_, data, size, desc, peer_, nullptr); }, "fi_send");
      ++tx_posted_;
    }
  }

  void post_recv(void* data, std::size_t size, void* desc, void* context) {
    post([&] { return fi_recv(ep_, data, size, desc, FI_ADDR_UNSPEC, context); }, "fi_recv");
  }

  // ---- completions

  // Reads what the CQ has: transmit completions are counted, receive and
  // remote-write completions queued for wait_rx().
  void progress() {
    fi_cq_data_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (entries[i].flags & (FI_RECV | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA))
          rx_.push_back(entries[i]);
        else
          ++tx_completed_;
      }
    } else if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(cq_, &err, 0);
      throw std::runtime_error(std::string("completion error: ") + fi_strerror(err.err) + " / " +
                               fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0));
    } else if (n != -FI_EAGAIN) {
      fail("fi_cq_read", n);
    }
  }

  // Drives progress until `done` (memory the peer writes) holds.
  template <class Pred>
  void spin_until_true(Pred done) {
    spin_until(done, "a polled write");
  }

  fi_cq_data_entry wait_rx() {
    spin_until([&] { return !rx_.empty(); }, "a receive completion");
    const fi_cq_data_entry e = rx_.front();
    rx_.pop_front();
    return e;
  }

  std::size_t outstanding_tx() const { return tx_posted_ - tx_completed_; }

  void wait_tx(std::size_t at_most_outstanding = 0) {
    spin_until([&] { return outstanding_tx() <= at_most_outstanding; }, "transmit completions");
  }

  // ---- control messages (small sends into a ring of pre-posted receives)

  void post_control_receives() {
    for (auto& slot : control_slots_) post_recv(&slot, sizeof slot, nullptr, &slot);
  }

  void send_control(std::uint64_t value) {
    control_out_ = value;
    send(&control_out_, sizeof control_out_, nullptr);
  }

  std::uint64_t wait_control() {
    const fi_cq_data_entry e = wait_rx();
    if (!(e.flags & FI_RECV) || !e.op_context)
      throw std::runtime_error("unexpected completion while waiting for a control message");
    auto* slot = static_cast<std::uint64_t*>(e.op_context);
    const std::uint64_t value = *slot;
    post_recv(slot, sizeof *slot, nullptr, slot);
    return value;
  }

  void expect_control(std::uint64_t want) {
    const std::uint64_t got = wait_control();
    if (got != want)
      throw std::runtime_error("control message " + std::to_string(got) + ", expected " +
                               std::to_string(want));
  }

 private:
  static void check(int rc, const char* what) {
    if (rc) fail(what, rc);
  }

  template <class Pred>
  void spin_until(Pred done, const char* what) {
    const auto deadline = bench_clock::now() + wait_limit;
    for (std::uint32_t spins = 1;; ++spins) {
      progress();
      if (done()) return;
      if ((spins & 0xffff) == 0 && bench_clock::now() > deadline)
        throw std::runtime_error(std::string("timed out waiting for ") + what);
    }
  }

  template <class Op>
  void post(Op op, const char* what) {
    const auto deadline = bench_clock::now() + wait_limit;
    for (std::uint32_t spins = 1;; ++spins) {
      const ssize_t rc = op();
      if (rc == 0) return;
      if (rc != -FI_EAGAIN) fail(what, rc);
      progress();
      if ((spins & 0xffff) == 0 && bench_clock::now() > deadline)
        throw std::runtime_error(std::string(what) + " kept returning -FI_EAGAIN");
    }
  }

  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  fi_addr_t peer_ = FI_ADDR_UNSPEC;
  std::vector<std::unique_ptr<local_buffer>> buffers_;
  std::uint64_t next_key_ = 1;
  std::size_t tx_posted_ = 0;
  std::size_t tx_completed_ = 0;
  std::deque<fi_cq_data_entry> rx_;
  std::uint64_t control_slots_[4] = {};
  std::uint64_t control_out_ = 0;
};

constexpr char parent_fill = 'P';
constexpr char child_fill = 'C';

// What the parent tells the child before each timed run. iterations == 0 ends
// the child's loop.
struct plan {
  std::uint64_t size;
  std::uint64_t iterations;
};

// Both processes' view of a connected pair: an endpoint, a registered buffer
// the peer may write into (`peer` is the peer's), and a registered scratch
// buffer of the same size, filled with the process's fill byte, as a source
// for streams and a landing place for messages.
struct session {
  raw_endpoint& ep;
  local_buffer& buffer;
  local_buffer& scratch;
  remote_buffer peer;
};

// Connects an endpoint in each process, runs `setup(session&)` on both sides
// before a barrier, then `parent_fn(session&, link)` in the parent and, in the
// child, `child_step(session&, plan)` once per plan the parent sends (each
// acknowledged on the link before it starts).
template <class Setup, class ParentFn, class ChildStep>
void with_connected_pair(const std::string& provider, std::size_t buffer_size, Setup setup,
                         ParentFn parent_fn, ChildStep child_step) {
  auto connect = [&](peer_link& link, char fill, auto&& body) {
    raw_endpoint ep(provider);
    ep.connect(link);
    local_buffer& buffer = ep.allocate(buffer_size);
    local_buffer& scratch = ep.allocate(buffer_size);
    std::memset(scratch.data, fill, buffer_size);
    session s{ep, buffer, scratch, raw_endpoint::exchange(link, buffer)};
    setup(s);
    link.barrier();
    body(s);
  };
  run_pair(
      [&](peer_link& link) {
        connect(link, parent_fill, [&](session& s) {
          parent_fn(s, link);
          link.send_value(plan{0, 0});
        });
      },
      [&](peer_link& link) {
        connect(link, child_fill, [&](session& s) {
          for (;;) {
            const plan p = link.recv_value<plan>();
            if (p.iterations == 0) break;
            link.send("ready");
            child_step(s, p);
          }
        });
      });
}

void post_control_receives(session& s) {
  s.ep.post_control_receives();
}

// Parent side: announce a plan, wait for the child's acknowledgement.
void start(peer_link& link, std::size_t size, std::size_t iterations) {
  link.send_value(plan{size, iterations});
  if (link.recv() != "ready") throw std::runtime_error("child out of step");
}

std::size_t max_of(const std::vector<std::size_t>& sizes) {
  return sizes.empty() ? 1 : *std::max_element(sizes.begin(), sizes.end());
}

}  // namespace

// ---------------------------------------------------------------- latency

std::vector<double> latency_us(const std::string& provider, transport how,
                               const std::vector<std::size_t>& sizes, bool quick) {
  std::vector<double> out;
  const std::size_t buffer_size = max_of(sizes);

  // One ping (or pong) of `size` bytes, and the wait for the other side's.
  // The msg variant receives into the scratch buffer and re-posts its single
  // receive before answering, so the peer's next message always finds it.
  auto post_receive = [how, buffer_size](session& s) {
    if (how == transport::msg) s.ep.post_recv(s.scratch.data, buffer_size, s.scratch.desc, nullptr);
  };
  // write_polled: each side's n-th ping carries tag n (mod 255, never 0) in
  // its last byte, written from scratch into the peer's buffer; the receiver
  // spins on that byte of its own buffer. The tags live in this process.
  std::uint8_t sent_tag = 0, seen_tag = 0;
  auto next = [](std::uint8_t t) { return static_cast<std::uint8_t>(t % 255 + 1); };
  std::size_t last_size = 8;
  auto send_one = [&, how](session& s, std::size_t size) {
    last_size = size;
    if (how == transport::write_polled) {
      sent_tag = next(sent_tag);
      s.scratch.data[size - 1] = static_cast<char>(sent_tag);
      if (size <= s.ep.inject_size())
        s.ep.inject_write(s.scratch, size, s.peer);
      else
        s.ep.write(s.scratch, size, s.peer);
    } else if (how == transport::write_data) {
      s.ep.write_data(s.buffer, size, s.peer, size);
    } else {
      s.ep.send(s.buffer.data, size, s.buffer.desc);
    }
  };
  auto receive_one = [&, how](session& s) {
    if (how == transport::write_polled) {
      seen_tag = next(seen_tag);
      volatile char* last = s.buffer.data + last_size - 1;
      s.ep.spin_until_true([&] { return static_cast<std::uint8_t>(*last) == seen_tag; });
      return;
    }
    const fi_cq_data_entry e = s.ep.wait_rx();
    if (how == transport::write_data && !(e.flags & FI_REMOTE_CQ_DATA))
      throw std::runtime_error("remote write completion without FI_REMOTE_CQ_DATA");
    post_receive(s);
  };

  with_connected_pair(
      provider, buffer_size, post_receive,
      [&](session& s, peer_link& link) {
        auto run = [&](std::size_t size, std::size_t iterations) {
          start(link, size, iterations);
          const auto t0 = bench_clock::now();
          for (std::size_t i = 0; i < iterations; ++i) {
            send_one(s, size);
            receive_one(s);
          }
          const auto t1 = bench_clock::now();
          s.ep.wait_tx();
          return seconds_between(t0, t1);
        };
        run(8, quick ? 200 : 2000);  // warm-up: connection setup (tcp), caches, page faults
        for (const std::size_t size : sizes) {
          out.push_back(calibrated_median(
              quick, 50, 2'000'000, [&](std::size_t n) { return run(size, n); },
              [](double seconds, std::size_t n) {
                return seconds / static_cast<double>(n) / 2 * 1e6;
              }));
        }
      },
      [&](session& s, const plan& p) {
        last_size = p.size;  // the size the parent's pings arrive with
        for (std::uint64_t i = 0; i < p.iterations; ++i) {
          receive_one(s);
          send_one(s, p.size);
        }
        s.ep.wait_tx();
      });
  return out;
}

// ---------------------------------------------------------------- bandwidth

namespace {

constexpr std::size_t stream_window = 32;

// Posts `count` writes of `size` bytes from scratch into the peer's buffer,
// keeping at most stream_window in flight, then the control message that
// (FI_ORDER_SAW) arrives after them.
void stream(session& s, std::size_t size, std::size_t count) {
  const std::size_t window = std::min(stream_window, s.ep.info().tx_attr->size / 2);
  for (std::size_t i = 0; i < count; ++i) {
    if (s.ep.outstanding_tx() >= window) s.ep.wait_tx(window - 1);
    s.ep.write(s.scratch, size, s.peer);
  }
  s.ep.send_control(control_done);
}

// The peer's DONE has arrived: if it streamed, its last byte must be there,
// else FI_ORDER_SAW did not hold and the figure would be a lie. Clears the
// byte for the next run.
void check_landed(session& s, std::size_t size, bool peer_streamed, char peer_fill) {
  char& last = s.buffer.data[size - 1];
  if (peer_streamed && last != peer_fill)
    throw std::runtime_error("streamed data had not landed when DONE arrived");
  last = 0;
}

}  // namespace

std::vector<double> write_bandwidth_GBps(const std::string& provider, direction dir,
                                         const std::vector<std::size_t>& sizes, bool quick) {
  std::vector<double> out;
  const bool both = dir == direction::both_ways;
  // Protocol of one run: parent sends GO and streams (DONE after its writes);
  // the child streams too when both ways (else sends only DONE), then answers
  // the parent's DONE with FIN. The parent stops the clock when it holds the
  // child's DONE and FIN: all bytes of both directions have landed.
  with_connected_pair(
      provider, max_of(sizes), post_control_receives,
      [&](session& s, peer_link& link) {
        auto run = [&](std::size_t size, std::size_t iterations) {
          start(link, size, iterations);
          const auto t0 = bench_clock::now();
          s.ep.send_control(control_go);
          stream(s, size, iterations);
          s.ep.expect_control(control_done);
          check_landed(s, size, both, child_fill);
          s.ep.expect_control(control_fin);
          s.ep.wait_tx();
          return seconds_between(t0, bench_clock::now());
        };
        run(64 * 1024, 64);  // warm-up
        for (const std::size_t size : sizes) {
          const std::size_t probe = std::max<std::size_t>(16, (1 << 20) / size);
          out.push_back(calibrated_median(
              quick, probe, 4'000'000, [&](std::size_t n) { return run(size, n); },
              [&](double seconds, std::size_t n) {
                const double bytes = static_cast<double>(size) * static_cast<double>(n);
                return (both ? 2 : 1) * bytes / seconds / 1e9;
              }));
        }
      },
      [&](session& s, const plan& p) {
        s.ep.expect_control(control_go);
        stream(s, p.size, both ? p.iterations : 0);
        s.ep.expect_control(control_done);
        check_landed(s, p.size, true, parent_fill);
        s.ep.send_control(control_fin);
        s.ep.wait_tx();
      });
  return out;
}

// ---------------------------------------------------------------- overhead

std::vector<send_overhead> write_overhead_us(const std::string& provider,
                                             const std::vector<std::size_t>& sizes, bool quick) {
  std::vector<send_overhead> out;
  // The child only drives progress (shm performs small writes in the
  // target's progress) until the parent's DONE, which it answers with FIN:
  // the parent must not leave a run (or close its endpoint) while its DONE
  // may still sit unsent in a manual-progress provider.
  auto finish = [](session& s) {
    s.ep.send_control(control_done);
    s.ep.expect_control(control_fin);
  };
  with_connected_pair(
      provider, max_of(sizes), post_control_receives,
      [&](session& s, peer_link& link) {
        const std::size_t batch = std::min<std::size_t>(16, s.ep.info().tx_attr->size / 2);
        // Only the posting calls are timed; completions are reaped between batches.
        auto run_async = [&](std::size_t size, std::size_t iterations) {
          start(link, size, iterations);
          double seconds = 0;
          for (std::size_t done = 0; done < iterations;) {
            const std::size_t n = std::min(batch, iterations - done);
            const auto t0 = bench_clock::now();
            for (std::size_t i = 0; i < n; ++i) s.ep.write(s.buffer, size, s.peer);
            seconds += seconds_between(t0, bench_clock::now());
            s.ep.wait_tx();
            done += n;
          }
          finish(s);
          return seconds;
        };
        auto run_sync = [&](std::size_t size, std::size_t iterations) {
          start(link, size, iterations);
          const bool inject = size <= s.ep.inject_size();
          const auto t0 = bench_clock::now();
          for (std::size_t i = 0; i < iterations; ++i) {
            if (inject) {
              s.ep.inject_write(s.buffer, size, s.peer);
            } else {
              s.ep.write(s.buffer, size, s.peer);
              s.ep.wait_tx();
            }
          }
          const double seconds = seconds_between(t0, bench_clock::now());
          finish(s);
          return seconds;
        };
        auto per_call_us = [](double seconds, std::size_t n) {
          return seconds / static_cast<double>(n) * 1e6;
        };
        run_async(64, 256);  // warm-up
        for (const std::size_t size : sizes) {
          send_overhead o{};
          o.async_us = calibrated_median(
              quick, 256, 4'000'000, [&](std::size_t n) { return run_async(size, n); },
              per_call_us);
          o.sync_us = calibrated_median(
              quick, 256, 4'000'000, [&](std::size_t n) { return run_sync(size, n); }, per_call_us);
          out.push_back(o);
        }
      },
      [&](session& s, const plan&) {
        s.ep.expect_control(control_done);
        s.ep.send_control(control_fin);
      });
  return out;
}

// ---------------------------------------------------------------- memcpy

std::vector<double> memcpy_bandwidth_GBps(const std::vector<std::size_t>& sizes, bool quick,
                                          bool cold) {
  std::vector<double> out;
  for (const std::size_t size : sizes) {
    const std::size_t arena =
        cold && size >= (1 << 20) ? std::max<std::size_t>(64 << 20, 4 * size) : size;
    // Page-aligned on purpose: with glibc's rep-movsb memcpy on this AMD EPYC,
    // copies run ~15x slower when (dst - src) mod 4096 lies in 1..31, which two
    // adjacent heap blocks easily hit.
    auto allocate = [arena](int fill) {
      std::unique_ptr<char, decltype(&std::free)> p(
          static_cast<char*>(std::aligned_alloc(4096, (arena + 4095) / 4096 * 4096)), &std::free);
      if (!p) throw std::bad_alloc();
      std::memset(p.get(), fill, arena);
      return p;
    };
    const auto src = allocate(1);
    const auto dst = allocate(2);
    std::size_t offset = 0;
    auto run = [&](std::size_t iterations) {
      const auto t0 = bench_clock::now();
      for (std::size_t i = 0; i < iterations; ++i) {
        std::memcpy(dst.get() + offset, src.get() + offset, size);
        // Keep the copy: the compiler must assume dst is read.
        __asm__ __volatile__("" : : "r"(dst.get()) : "memory");
        offset += size;
        if (offset + size > arena) offset = 0;
      }
      return seconds_between(t0, bench_clock::now());
    };
    const std::size_t probe = std::max<std::size_t>(16, (1 << 20) / size);
    out.push_back(
        calibrated_median(quick, probe, 100'000'000, run, [size](double seconds, std::size_t n) {
          return static_cast<double>(size) * static_cast<double>(n) / seconds / 1e9;
        }));
  }
  return out;
}

// ---------------------------------------------------------------- description

std::string describe_provider(const std::string& provider) {
  std::string text;
  run_pair([&](peer_link& link) { text = link.recv(); },
           [&](peer_link& link) {
             raw_endpoint ep(provider);
             const fi_info& info = ep.info();
             std::ostringstream os;
             os << provider << ": " << info.fabric_attr->prov_name << " " << info.fabric_attr->name
                << ", inject_size " << info.tx_attr->inject_size << ", tx/rx queue "
                << info.tx_attr->size << "/" << info.rx_attr->size << ", mr_mode"
                << (info.domain_attr->mr_mode & FI_MR_LOCAL ? " LOCAL" : "")
                << (info.domain_attr->mr_mode & FI_MR_VIRT_ADDR ? " VIRT_ADDR" : "")
                << (info.domain_attr->mr_mode & FI_MR_ALLOCATED ? " ALLOCATED" : "")
                << (info.domain_attr->mr_mode & FI_MR_PROV_KEY ? " PROV_KEY" : "")
                << (info.domain_attr->mr_mode ? "" : " (none)") << ", data progress "
                << (info.domain_attr->data_progress == FI_PROGRESS_MANUAL ? "manual" : "auto");
             link.send(os.str());
           });
  return text;
}

}  // namespace vmmc::bench::raw
