// integration.core.model: every call of the VMMC model between two contexts,
// over each transport (mapped, libfabric shm, libfabric tcp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <thread>

#include "integration/core/transports.h"

namespace vmmc::test {
namespace {

using namespace std::chrono_literals;
using core::rights;

class Model : public testing::TestWithParam<transport> {
 protected:
  void SetUp() override {
    exporter_.emplace(make_context(GetParam()));
    importer_.emplace(make_context(GetParam()));
  }
  core::context& exporter() { return *exporter_; }
  core::context& importer() { return *importer_; }

  // Exports `region` under `name` and imports it from the importer.
  // `exported`, when given, receives the export's handle.
  core::import_handle export_and_import(guarded_region& region, const char* name,
                                        core::export_options options = {},
                                        core::export_handle* exported = nullptr) {
    auto e = exporter().export_buffer(name, region.data(), region.size(), std::move(options));
    EXPECT_TRUE(e) << e.error().message();
    if (e && exported) *exported = *e;
    auto i = importer().import_buffer(exporter().address(), name);
    EXPECT_TRUE(i) << i.error().message();
    return i ? *i : core::import_handle{};
  }

  // Waits until the exporter has run `target` notifications in total.
  void await_notifications(std::atomic<int>& seen, int target) {
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (seen.load() < target && std::chrono::steady_clock::now() < deadline)
      (void)exporter().wait_notifications(100ms);
    ASSERT_EQ(seen.load(), target);
  }

  // A thread writes the whole region over and over with `send` while the
  // exporter withdraws `e` and reuses the memory: exactly one send is refused
  // (unknown_handle) and no byte lands after unexport returned. Whole-region
  // writes keep a large zero-copy write in flight across the revocation (over
  // tcp such a write completed, and was acknowledged, before it landed).
  template <class Send>
  void expect_unexport_stops_writer(guarded_region& region, core::export_handle e, Send send) {
    std::atomic<bool> stop{false};
    std::atomic<int> refused{0};
    std::thread writer([&] {
      std::vector<std::byte> chunk(region.size(), std::byte{0x77});
      while (!stop) {
        status s = send(chunk);
        if (!s) {
          EXPECT_TRUE(s.is(errc::unknown_handle)) << s.error().message();
          ++refused;
          break;
        }
      }
    });
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(exporter().unexport_buffer(e).ok());
    std::memset(region.data(), 0, region.size());  // the exporter reuses its memory
    std::this_thread::sleep_for(100ms);
    stop = true;
    writer.join();
    EXPECT_EQ(refused.load(), 1);
    for (std::size_t i = 0; i < region.size(); ++i) ASSERT_EQ(region.data()[i], std::byte{0}) << i;
  }

  // Polls an 8-byte word of exported memory until it is no longer 0 (5 s).
  std::uint64_t await_word(const std::byte* at) {
    std::uint64_t v = 0;
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      v = std::atomic_ref<const std::uint64_t>(*reinterpret_cast<const std::uint64_t*>(at)).load();
      if (v) break;
      importer().progress();
      exporter().progress();
    }
    return v;
  }

  std::optional<core::context> exporter_, importer_;
};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<unsigned char>(i * 31 + seed));
  return v;
}

TEST_P(Model, AddressIsPrintableAndDistinct) {
  const std::string& a = exporter().address();
  EXPECT_NE(a, importer().address());
  for (char c : a) EXPECT_TRUE(c > ' ' && c <= '~') << a;
}

TEST_P(Model, ImportTakesTheExpectedPathAndDescribesTheRegion) {
  guarded_region region(exporter(), 1 << 16, GetParam().mappable);
  core::export_options o;
  o.allowed = rights::read_write;
  auto h = export_and_import(region, "described", o);
  auto info = importer().describe(h);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->length, region.size());
  EXPECT_EQ(info->allowed, rights::read_write);
  EXPECT_EQ(*importer().path_of(h), GetParam().expect);
}

// Sends of every size class (inline, bounced, zero-copy) land exactly where
// they were aimed; the notification of each runs after its data is in place.
TEST_P(Model, SendsLandExactlyAndNotifyAfterTheData) {
  guarded_region region(exporter(), 4 << 20, GetParam().mappable);
  std::atomic<int> seen{0};
  std::vector<core::notification> got;
  bool data_was_there = true;
  std::vector<std::byte> expected(region.size(), std::byte{0});
  core::export_options o;
  o.on_notify = [&](const core::notification& n) {
    data_was_there &=
        std::memcmp(region.data() + n.offset, expected.data() + n.offset, n.length) == 0;
    got.push_back(n);
    ++seen;
  };
  auto h = export_and_import(region, "sizes", o);
  const std::size_t sizes[] = {1, 8, 63, 64, 65, 3000, 4096, 4097, 65536, 1 << 20, 3 << 20};
  std::uint64_t offset = 0;
  int n = 0;
  for (std::size_t size : sizes) {
    offset = (offset + 7) % (region.size() - size);
    auto data = pattern(size, static_cast<unsigned>(size));
    std::memcpy(expected.data() + offset, data.data(), size);
    ASSERT_TRUE(importer().send(h, offset, data.data(), size, {true, size}).ok()) << size;
    ++n;
    await_notifications(seen, n);
    EXPECT_EQ(got.back().offset, offset);
    EXPECT_EQ(got.back().length, size);
    EXPECT_EQ(got.back().value, size);
    offset += size;
  }
  EXPECT_TRUE(data_was_there);
  EXPECT_EQ(std::memcmp(region.data(), expected.data(), region.size()), 0);
  EXPECT_TRUE(region.guards_intact());
}

TEST_P(Model, FetchReadsWhatTheExporterHas) {
  guarded_region region(exporter(), 2 << 20, GetParam().mappable);
  auto data = pattern(region.size(), 7);
  std::memcpy(region.data(), data.data(), data.size());
  core::export_options o;
  o.allowed = rights::read;
  auto h = export_and_import(region, "readable", o);
  for (std::size_t size :
       {std::size_t{1}, std::size_t{100}, std::size_t{4096}, std::size_t{100000}, region.size()}) {
    std::vector<std::byte> out(size);
    std::uint64_t offset = region.size() - size;
    ASSERT_TRUE(importer().fetch(h, offset, out.data(), size).ok()) << size;
    EXPECT_EQ(std::memcmp(out.data(), data.data() + offset, size), 0) << size;
  }
}

// A fetch issued after a send returns the sent bytes (per-pair ordering).
TEST_P(Model, FetchAfterSendSeesTheSend) {
  guarded_region region(exporter(), 1 << 20, GetParam().mappable);
  core::export_options o;
  o.allowed = rights::read_write;
  auto h = export_and_import(region, "ordered", o);
  for (std::size_t size : {std::size_t{8}, std::size_t{2000}, std::size_t{1 << 19}}) {
    auto data = pattern(size, 3);
    ASSERT_TRUE(importer().send(h, 64, data.data(), size).ok());
    std::vector<std::byte> back(size);
    ASSERT_TRUE(importer().fetch(h, 64, back.data(), size).ok());
    EXPECT_EQ(back, data) << size;
  }
}

TEST_P(Model, AsyncRequestsReturnTheirContext) {
  guarded_region region(exporter(), 1 << 20, GetParam().mappable);
  core::export_options o;
  o.allowed = rights::read_write;
  auto h = export_and_import(region, "async", o);
  std::vector<std::vector<std::byte>> sources;
  std::vector<core::request> requests;
  int contexts[16];
  for (int i = 0; i < 16; ++i) {
    sources.push_back(pattern(size_t{1} << (i + 2), static_cast<unsigned>(i)));
    auto r = importer().send_async(h, static_cast<std::uint64_t>(i) << 15, sources.back().data(),
                                   sources.back().size(), {}, &contexts[i]);
    ASSERT_TRUE(r) << r.error().message();
    requests.push_back(*r);
  }
  for (int i = 0; i < 16; ++i) {
    auto c = importer().wait(requests[static_cast<std::size_t>(i)], 5000ms);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_FALSE(c->error);
    EXPECT_EQ(c->user_context, &contexts[i]);
    // Reported once: the request is released.
    EXPECT_TRUE(importer().test(requests[static_cast<std::size_t>(i)]).is(errc::unknown_handle));
  }
  std::vector<std::byte> back(1 << 15);
  auto f = importer().fetch_async(h, 15 << 15, back.data(), back.size(), &contexts[0]);
  ASSERT_TRUE(f);
  result<core::completion> c = errc::would_block;
  for (int spins = 0; spins < 1000000 && c.is(errc::would_block); ++spins) c = importer().test(*f);
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->user_context, &contexts[0]);
  EXPECT_EQ(std::memcmp(back.data(), sources[15].data(), back.size()), 0);
}

TEST_P(Model, NotificationFdBecomesReadable) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  std::atomic<int> seen{0};
  core::export_options o;
  o.on_notify = [&](const core::notification&) { ++seen; };
  auto h = export_and_import(region, "fd", o);
  int fd = exporter().notification_fd();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(exporter().prepare_wait());  // nothing pending yet
  std::thread sender([&] {
    std::this_thread::sleep_for(50ms);
    std::uint64_t v = 1;
    EXPECT_TRUE(importer().send(h, 0, &v, sizeof v, {true, 9}).ok());
  });
  pollfd p{fd, POLLIN, 0};
  int ready = ::poll(&p, 1, 5000);
  sender.join();
  ASSERT_EQ(ready, 1);
  EXPECT_EQ(exporter().poll_notifications(), 1u);
  EXPECT_EQ(seen.load(), 1);
}

// An export's wake eventfd is lent to importers that map it: wake() writes
// it. Elsewhere (the fabric path) there is nothing to wake through, and a
// descriptor that is not an eventfd (a pipe, whose write could block the
// importer) is never used.
TEST_P(Model, WakeReachesTheExportersEventfdOnlyWhereLent) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  core::export_options o;
  o.wake_fd = efd;
  auto h = export_and_import(region, "woken", o);
  auto info = importer().describe(h);
  ASSERT_TRUE(info);
  const bool lent = GetParam().mappable;
  EXPECT_EQ(info->wakeable, lent);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(importer().wake(h).ok(), lent);
  std::uint64_t count = 0;
  if (lent) {
    ASSERT_EQ(::read(efd, &count, sizeof count), static_cast<ssize_t>(sizeof count));
    EXPECT_EQ(count, 3u);
  } else {
    EXPECT_TRUE(importer().wake(h).is(errc::invalid_argument));
  }
  ASSERT_TRUE(importer().unimport_buffer(h).ok());
  EXPECT_TRUE(importer().wake(h).is(errc::unknown_handle));

  // Without a wake descriptor: not wakeable.
  guarded_region plain(exporter(), 4096, GetParam().mappable);
  auto p = export_and_import(plain, "unwoken", {});
  EXPECT_FALSE(importer().describe(p)->wakeable);
  EXPECT_TRUE(importer().wake(p).is(errc::invalid_argument));

  // A pipe posing as the wake descriptor: refused by the importer.
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  ASSERT_EQ(::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK), 0);  // the write end stays blocking
  guarded_region piped(exporter(), 4096, GetParam().mappable);
  core::export_options po;
  po.wake_fd = pipe_fds[1];
  auto q = export_and_import(piped, "piped", po);
  EXPECT_FALSE(importer().describe(q)->wakeable);
  EXPECT_TRUE(importer().wake(q).is(errc::invalid_argument));
  char byte;
  EXPECT_EQ(::read(pipe_fds[0], &byte, 1), -1);  // nothing was written (and never blocked)
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ::close(efd);
}

TEST_P(Model, BlockingWaitTimesOutThenWakes) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  std::atomic<int> seen{0};
  core::export_options o;
  o.on_notify = [&](const core::notification& n) { seen += static_cast<int>(n.value); };
  auto h = export_and_import(region, "block", o);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(exporter().wait_notifications(100ms).is(errc::timed_out));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 100ms);
  std::thread sender([&] {
    std::this_thread::sleep_for(100ms);
    std::uint32_t v = 5;
    EXPECT_TRUE(importer().send(h, 8, &v, sizeof v, {true, 5}).ok());
  });
  auto n = exporter().wait_notifications(5000ms);
  sender.join();
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(seen.load(), 5);
}

TEST_P(Model, ManyNotificationsNoneLost) {
  guarded_region region(exporter(), 1 << 16, GetParam().mappable);
  std::atomic<int> seen{0};
  std::uint64_t sum = 0;
  core::export_options o;
  o.on_notify = [&](const core::notification& n) {
    sum += n.value;
    ++seen;
  };
  auto h = export_and_import(region, "many", o);
  constexpr int count = 5000;  // more than the mapped ring holds: exercises flow control
  std::thread sender([&] {
    for (int i = 1; i <= count; ++i) {
      std::uint32_t v = static_cast<std::uint32_t>(i);
      ASSERT_TRUE(importer()
                      .send(h, (i % 100) * 4, &v, sizeof v, {true, static_cast<std::uint64_t>(i)})
                      .ok());
    }
  });
  await_notifications(seen, count);
  sender.join();
  EXPECT_EQ(sum, std::uint64_t{count} * (count + 1) / 2);
}

TEST_P(Model, ImportPolicyIsEnforcedByTheExporter) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  core::export_options only_someone_else;
  only_someone_else.policy = core::import_policy::only({exporter().address()});
  ASSERT_TRUE(exporter().export_buffer("private", region.data(), 2048, only_someone_else));
  EXPECT_TRUE(
      importer().import_buffer(exporter().address(), "private").is(errc::permission_denied));

  core::export_options only_importer;
  only_importer.policy = core::import_policy::only({importer().address()});
  ASSERT_TRUE(exporter().export_buffer("named", region.data() + 2048, 2048, only_importer));
  EXPECT_TRUE(importer().import_buffer(exporter().address(), "named"));

  EXPECT_TRUE(importer().import_buffer(exporter().address(), "nonesuch").is(errc::unknown_export));
  EXPECT_TRUE(exporter().export_buffer("named", region.data(), 16).is(errc::already_exists));
  EXPECT_TRUE(importer().import_buffer("vmmc1;garbage", "named").is(errc::invalid_argument));
  EXPECT_TRUE(importer().import_buffer(exporter().address(), "").is(errc::invalid_argument));
}

// Every bad range or missing right is refused before anything is posted, and
// not one byte around (or inside) the region changes.
TEST_P(Model, BadRangesAndRightsChangeNothing) {
  guarded_region region(exporter(), 8192, GetParam().mappable);
  core::export_options write_only;  // default rights: write
  auto w = export_and_import(region, "write-only", write_only);
  core::export_options read_only;
  read_only.allowed = rights::read;
  ASSERT_TRUE(exporter().export_buffer("read-only", region.data(), region.size(), read_only));
  auto r = importer().import_buffer(exporter().address(), "read-only");
  ASSERT_TRUE(r);

  std::vector<std::byte> junk(region.size() + 4096, std::byte{0xEE});
  const std::uint64_t n = region.size();
  struct bad {
    std::uint64_t offset;
    std::size_t length;
  } cases[] = {{n, 1},
               {n - 1, 2},
               {0, n + 1},
               {n + 4096, 8},
               {~std::uint64_t{0}, 2},
               {~std::uint64_t{0} - 3, 8},
               {8, static_cast<std::size_t>(-8)}};
  for (const bad& b : cases) {
    EXPECT_TRUE(importer().send(w, b.offset, junk.data(), b.length).is(errc::out_of_range))
        << b.offset << "+" << b.length;
    EXPECT_TRUE(importer().send_async(w, b.offset, junk.data(), b.length).is(errc::out_of_range));
    EXPECT_TRUE(importer().fetch(*r, b.offset, junk.data(), b.length).is(errc::out_of_range));
  }
  std::byte out[16];
  EXPECT_TRUE(importer().fetch(w, 0, out, sizeof out).is(errc::permission_denied));
  EXPECT_TRUE(importer().send(*r, 0, junk.data(), 16).is(errc::permission_denied));
  EXPECT_TRUE(importer().send(w, 0, nullptr, 16).is(errc::invalid_argument));

  // A valid send at the very end still works, and everything else is as before.
  std::byte last{0x11};
  ASSERT_TRUE(importer().send(w, n - 1, &last, 1).ok());
  std::byte check{};
  ASSERT_TRUE(importer().fetch(*r, n - 1, &check, 1).ok());  // ordered after the send
  EXPECT_EQ(check, last);
  for (std::size_t i = 0; i + 1 < n; ++i) ASSERT_EQ(region.data()[i], std::byte{0}) << i;
  EXPECT_TRUE(region.guards_intact());
}

TEST_P(Model, UnknownAndReleasedHandles) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  auto h = export_and_import(region, "released");
  std::uint64_t v = 1;
  EXPECT_TRUE(importer().send(core::import_handle{987654}, 0, &v, 8).is(errc::unknown_handle));
  EXPECT_TRUE(importer().describe(core::import_handle{987654}).is(errc::unknown_handle));
  EXPECT_TRUE(importer().wait(core::request{424242}, 10ms).is(errc::unknown_handle));
  EXPECT_TRUE(exporter().unexport_buffer(core::export_handle{31337}).is(errc::unknown_handle));
  ASSERT_TRUE(importer().unimport_buffer(h).ok());
  EXPECT_TRUE(importer().unimport_buffer(h).is(errc::unknown_handle));
  EXPECT_TRUE(importer().send(h, 0, &v, 8).is(errc::unknown_handle));
}

// After unexport returns, no importer can write into the memory any more.
TEST_P(Model, UnexportRevokesImports) {
  guarded_region region(exporter(), 1 << 20, GetParam().mappable);
  core::export_handle e{};
  auto h = export_and_import(region, "revoked", {}, &e);
  ASSERT_FALSE(HasFailure());
  expect_unexport_stops_writer(region, e, [&](const std::vector<std::byte>& chunk) {
    return importer().send(h, 0, chunk.data(), chunk.size());
  });
  // The name is free again.
  EXPECT_TRUE(exporter().export_buffer("revoked", region.data(), region.size()));
}

TEST_P(Model, GatheredSendsLandInOrderOrNotAtAll) {
  guarded_region region(exporter(), 8192, GetParam().mappable);
  auto h = export_and_import(region, "gathered");
  auto a = pattern(100, 1), b = pattern(3000, 2);
  const std::uint64_t flag = 0x1122334455667788;
  const core::send_piece pieces[] = {
      {16, a.data(), a.size()}, {4096, b.data(), b.size()}, {0, &flag, sizeof flag}};
  ASSERT_TRUE(importer().send(h, pieces).ok());
  // The flag lands last: once it is seen, the pieces before it are there.
  EXPECT_EQ(await_word(region.data()), flag);
  EXPECT_EQ(std::memcmp(region.data() + 16, a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(region.data() + 4096, b.data(), b.size()), 0);

  // One bad piece: nothing of the call is written.
  std::memset(region.data(), 0, region.size());
  const core::send_piece bad[] = {{0, a.data(), a.size()}, {8190, b.data(), 8}};
  EXPECT_TRUE(importer().send(h, bad).is(errc::out_of_range));
  auto sender = importer().bind(h);
  ASSERT_TRUE(sender);
  EXPECT_TRUE(sender->send(bad).is(errc::out_of_range));
  std::this_thread::sleep_for(20ms);  // a wrongly posted fabric write would have landed
  for (std::size_t i = 0; i < region.size(); ++i) ASSERT_EQ(region.data()[i], std::byte{0}) << i;
  EXPECT_TRUE(region.guards_intact());
}

TEST_P(Model, SenderSendsUntilTheImportIsReleased) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  auto h = export_and_import(region, "bound");
  EXPECT_TRUE(importer().bind(core::import_handle{987654}).is(errc::unknown_handle));
  auto sender = importer().bind(h);
  ASSERT_TRUE(sender);
  const auto before = importer().stats().sends;
  auto a = pattern(64, 3);
  const std::uint64_t flag = 7;
  const core::send_piece pieces[] = {{8, a.data(), a.size()}, {0, &flag, sizeof flag}};
  ASSERT_TRUE(sender->send(pieces).ok());
  ASSERT_TRUE(sender->send(4000, a.data(), 8).ok());
  EXPECT_EQ(importer().stats().sends, before + 3);
  EXPECT_EQ(await_word(region.data()), flag);
  EXPECT_EQ(std::memcmp(region.data() + 8, a.data(), a.size()), 0);
  EXPECT_TRUE(sender->send(4090, a.data(), 8).is(errc::out_of_range));
  ASSERT_TRUE(importer().unimport_buffer(h).ok());
  EXPECT_TRUE(sender->send(0, a.data(), 8).is(errc::unknown_handle));
  EXPECT_TRUE(core::sender{}.send(0, a.data(), 8).is(errc::unknown_handle));
}

// Pieces that continue each other go as one write on the fabric path; the
// counts stay per piece, and stay counted once their sender is gone.
TEST_P(Model, GatheredPiecesLandAndAreCountedOncePerPiece) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  core::export_options o;
  o.allowed = rights::read_write;  // read back below
  auto h = export_and_import(region, "gathered", o);
  auto a = pattern(40, 5), b = pattern(24, 6);
  const std::uint64_t flag = 9;
  const core::send_piece pieces[] = {
      {16, a.data(), a.size()}, {56, b.data(), b.size()}, {80, nullptr, 0}, {0, &flag, 8}};
  const core::counters before = importer().stats();
  {
    auto sender = importer().bind(h);
    ASSERT_TRUE(sender);
    ASSERT_TRUE(sender->send(pieces).ok());
  }
  ASSERT_TRUE(importer().send(h, pieces).ok());
  auto again = importer().bind(h);  // folds the first sender's counts
  ASSERT_TRUE(again);
  const core::counters after = importer().stats();
  EXPECT_EQ(after.sends, before.sends + 8);
  EXPECT_EQ(after.bytes_sent, before.bytes_sent + 2 * (40 + 24 + 8));
  EXPECT_EQ(await_word(region.data()), flag);
  // The flag seen may be the first send's: the second may still be on its
  // way (over tcp the exporter's progress lands it later, and wrote into
  // the unmapped region once the test had returned: SEGV under TSan). A
  // fetch is ordered behind both.
  std::uint64_t back = 0;
  ASSERT_TRUE(importer().fetch(h, 0, &back, sizeof back).ok());
  EXPECT_EQ(back, flag);
  EXPECT_EQ(std::memcmp(region.data() + 16, a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(region.data() + 56, b.data(), b.size()), 0);
  EXPECT_TRUE(region.guards_intact());
}

// A sender takes no lock on the mapped path: revocation must still leave the
// exporter's reused memory untouched.
TEST_P(Model, UnexportRevokesSenders) {
  guarded_region region(exporter(), 1 << 20, GetParam().mappable);
  core::export_handle e{};
  auto h = export_and_import(region, "revoked-sender", {}, &e);
  ASSERT_FALSE(HasFailure());
  auto sender = importer().bind(h);
  ASSERT_TRUE(sender);
  expect_unexport_stops_writer(region, e, [&](const std::vector<std::byte>& chunk) {
    return sender->send(0, chunk.data(), chunk.size());
  });
}

// An export withdrawn while an import of it is on its way (the reply left the
// exporter, the revoke follows it) must not leave the importer a live handle:
// over tcp its first fetch used a deregistered key and the provider closed
// the connection under every other import between the two contexts (found by
// integration.sockets.semantics.tcp, a client attaching to a server's area
// while the server closed). Each round either refuses the import or the
// operation, or runs it before the withdrawal; the long-lived import keeps
// working and nothing lands in withdrawn memory.
TEST_P(Model, ExportWithdrawnDuringItsImportLeavesNoLiveHandle) {
  core::export_options o;
  o.allowed = rights::read_write;
  guarded_region keep_region(exporter(), 4096, GetParam().mappable);
  auto keep = export_and_import(keep_region, "keep", o);
  ASSERT_FALSE(HasFailure());
  guarded_region region(exporter(), 4096, GetParam().mappable);
  std::uint64_t word = 0;
  int imported = 0, refused = 0;
  for (int round = 0; round < 200; ++round) {
    const std::string name = "withdrawn-" + std::to_string(round);
    auto e = exporter().export_buffer(name, region.data(), region.size(), o);
    ASSERT_TRUE(e) << e.error().message();
    std::thread withdraw([&, delay = round % 30] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay * 20));
      EXPECT_TRUE(exporter().unexport_buffer(*e).ok());
      std::memset(region.data(), 0, region.size());  // reused at once
    });
    auto h = importer().import_buffer(exporter().address(), name);
    if (h) {
      ++imported;
      const std::uint64_t one = 1;
      status sent = importer().send(*h, 64, &one, sizeof one);
      status fetched = importer().fetch(*h, 0, &word, sizeof word);
      for (const status& s : {sent, fetched})
        EXPECT_TRUE(s.ok() || s.is(errc::unknown_handle)) << round << ": " << s.error().message();
      (void)importer().unimport_buffer(*h);
    } else {
      ++refused;
      EXPECT_TRUE(h.is(errc::unknown_export)) << round << ": " << h.error().message();
    }
    withdraw.join();
    std::uint64_t after = 0;
    std::memcpy(&after, region.data() + 64, sizeof after);
    ASSERT_EQ(after, 0u) << "round " << round << ": a send landed after the withdrawal";
    status alive = importer().fetch(keep, 0, &word, sizeof word);
    ASSERT_TRUE(alive.ok()) << "round " << round << ": " << alive.error().message();
  }
  EXPECT_TRUE(region.guards_intact());
  std::printf("imported %d, refused %d of 200\n", imported, refused);
}

// An import the exporter refuses because the export went while it was being
// answered changes nothing else: the importer's other imports from that peer
// keep working. (A refusal still declared the descriptor of a mapped answer;
// the importer took the frame for garbage and the peer for gone, so every
// healthy import from it failed. Seen as a sockets test killed by SIGPIPE:
// connections closing at once broke another connection of the process.)
TEST_P(Model, RefusedImportsLeaveTheOtherImportsOfThePeerWorking) {
  core::export_options o;
  o.allowed = rights::read_write;
  guarded_region keep_region(exporter(), 4096, GetParam().mappable);
  auto keep = export_and_import(keep_region, "keep", o);
  ASSERT_FALSE(HasFailure());
  guarded_region region(exporter(), 4096, GetParam().mappable);
  std::atomic<bool> stop{false};
  std::atomic<int> cycles{0};
  // Withdraws and offers the name again as fast as it can, so that many
  // imports meet the export between being looked up and being answered.
  std::thread churn([&] {
    while (!stop.load()) {
      auto e = exporter().export_buffer("churning", region.data(), region.size(), o);
      ASSERT_TRUE(e) << e.error().message();
      ASSERT_TRUE(exporter().unexport_buffer(*e).ok());
      ++cycles;
    }
  });
  int imported = 0, refused = 0;
  std::uint64_t word = 0;
  // The keep import is checked now and then, and at the end: a peer taken
  // for gone stays gone. (Over shm a fetch waits for the exporter's progress,
  // which nobody drives here: up to its 10 ms tick.)
  auto keep_works = [&] {
    status alive = importer().fetch(keep, 0, &word, sizeof word);
    EXPECT_TRUE(alive.ok()) << "after " << imported + refused
                            << " imports: " << alive.error().message();
    return alive.ok();
  };
  const auto until = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < until) {
    auto h = importer().import_buffer(exporter().address(), "churning");
    if (h) {
      ++imported;
      (void)importer().unimport_buffer(*h);
    } else {
      ++refused;
      EXPECT_TRUE(h.is(errc::unknown_export)) << h.error().message();
    }
    if ((imported + refused) % 256 == 0 && !keep_works()) break;
  }
  stop = true;
  churn.join();
  keep_works();
  std::printf("imported %d, refused %d, %d export cycles\n", imported, refused, cycles.load());
  EXPECT_GT(imported + refused, 100);
}

TEST_P(Model, ExporterGoneIsReportedOnEveryOperation) {
  guarded_region region(exporter(), 4096, GetParam().mappable);
  core::export_options o;
  o.allowed = rights::read_write;
  auto h = export_and_import(region, "vanishing", o);
  exporter_.reset();
  std::uint64_t v = 0;
  auto t0 = std::chrono::steady_clock::now();
  status s;
  while ((s = importer().send(h, 0, &v, 8)).ok() && std::chrono::steady_clock::now() - t0 < 2s)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(s.is(errc::peer_gone) || s.is(errc::unknown_handle)) << s.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_FALSE(importer().fetch(h, 0, &v, 8).ok());
  EXPECT_FALSE(importer().send_async(h, 0, &v, 8));
}

// Two contexts of one process, either of which closes while transfers
// between them are still queued: the other goes on without following
// anything of it. (libfabric 1.17's shm reaches an endpoint of its own
// process through that endpoint's region, not a mapping of its own: the
// survivor's progress followed the closed one's freed region, SIGSEGV in
// fi_cq_read, and its next send would have written through it.)
TEST_P(Model, APeerInTheSameProcessMayCloseWithTransfersQueued) {
  const auto payload = pattern(60000, 9);
  for (int round = 0; round < 12; ++round) {
    const bool importer_first = round % 2 == 0;
    std::optional<core::context> exporting(make_context(GetParam()));
    std::optional<core::context> importing(make_context(GetParam()));
    guarded_region region(*exporting, 1 << 17, GetParam().mappable);
    core::export_options o;
    o.on_notify = [](const core::notification&) {};
    ASSERT_TRUE(exporting->export_buffer("queued", region.data(), region.size(), std::move(o)));
    auto h = importing->import_buffer(exporting->address(), "queued");
    ASSERT_TRUE(h) << h.error().message();
    // Sizes that travel inline, through the target's inject buffers, and as
    // pulled (bounced or zero-copy) writes; none is waited for.
    std::vector<core::request> requests;
    for (std::size_t size : {8, 1000, 4000, 20000, 60000}) {
      auto r = importing->send_async(*h, 0, payload.data(), size, {true, size});
      ASSERT_TRUE(r) << r.error().message();
      requests.push_back(*r);
    }
    std::optional<core::context>& survivor = importer_first ? exporting : importing;
    (importer_first ? importing : exporting).reset();
    // The survivor progresses (and, as the importer, sends) into a peer that
    // is gone: errors, no crash.
    const auto until = std::chrono::steady_clock::now() + 5ms;
    while (std::chrono::steady_clock::now() < until) {
      survivor->progress();
      (void)survivor->poll_notifications();
      if (!importer_first) (void)survivor->send(*h, 0, payload.data(), 1000);
    }
    if (!importer_first)
      for (core::request r : requests) (void)survivor->wait(r, 1s);
    // The survivor goes before the region: as the exporter, its progress
    // may still land bytes the importer sent before it closed.
    survivor.reset();
    EXPECT_TRUE(region.guards_intact());
  }
}

TEST_P(Model, ConcurrentSendersToOneExport) {
  guarded_region region(exporter(), 1 << 20, GetParam().mappable);
  std::atomic<int> seen{0};
  core::export_options o;
  o.on_notify = [&](const core::notification&) { ++seen; };
  auto h = export_and_import(region, "shared", o);
  constexpr int threads = 2, per_thread = 300;
  std::vector<std::thread> senders;
  for (int t = 0; t < threads; ++t)
    senders.emplace_back([&, t] {
      auto data = pattern(4096 + 1000 * static_cast<std::size_t>(t), static_cast<unsigned>(t));
      for (int i = 0; i < per_thread; ++i)
        ASSERT_TRUE(
            importer()
                .send(h, static_cast<std::uint64_t>(t) << 19, data.data(), data.size(), {true, 0})
                .ok());
    });
  for (auto& s : senders) s.join();
  await_notifications(seen, threads * per_thread);
  for (int t = 0; t < threads; ++t) {
    auto data = pattern(4096 + 1000 * static_cast<std::size_t>(t), static_cast<unsigned>(t));
    EXPECT_EQ(
        std::memcmp(region.data() + (static_cast<std::size_t>(t) << 19), data.data(), data.size()),
        0);
  }
}

// Zero-copy sends register their source once (UTLB); later sends from the
// same buffer hit the cache.
TEST_P(Model, ZeroCopySendsHitTheRegistrationCache) {
  if (GetParam().mappable) GTEST_SKIP() << "the mapped path copies at user level: no registration";
  guarded_region region(exporter(), 1 << 20, false);
  core::export_options o;
  o.allowed = rights::read_write;  // the bytes are read back below
  auto h = export_and_import(region, "utlb", o);
  std::vector<std::byte> source(1 << 20, std::byte{3});
  const core::counters before = importer().stats();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(importer().send(h, 0, source.data(), source.size()).ok());
  const core::counters after = importer().stats();
  // A send returns once its source may be reused, not once the bytes landed:
  // read them back (ordered behind the writes) before the region is unmapped,
  // or the exporter's progress would still be writing into it.
  std::vector<std::byte> back(source.size());
  ASSERT_TRUE(importer().fetch(h, 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, source);
  EXPECT_EQ(after.utlb_lookups - before.utlb_lookups, 4u);
  EXPECT_EQ(after.utlb_registrations - before.utlb_registrations, 1u);
  EXPECT_EQ(after.utlb_hits - before.utlb_hits, 3u);
  EXPECT_GE(after.utlb_bytes_registered, source.size());
}

// With a registration limit below the transfer size, transfers still work
// (through bounce buffers) and nothing beyond the limit is registered.
TEST_P(Model, TransfersLargerThanTheRegistrationLimit) {
  ::setenv("VMMC_CORE_UTLB_LIMIT", "64k", 1);
  core::context small_exporter = make_context(GetParam());
  core::context small_importer = make_context(GetParam());
  ::unsetenv("VMMC_CORE_UTLB_LIMIT");
  guarded_region region(small_exporter, 1 << 20, GetParam().mappable);
  core::export_options o;
  o.allowed = rights::read_write;
  ASSERT_TRUE(small_exporter.export_buffer("big", region.data(), region.size(), o));
  auto h = small_importer.import_buffer(small_exporter.address(), "big");
  ASSERT_TRUE(h);
  auto data = pattern(region.size(), 11);
  ASSERT_TRUE(small_importer.send(*h, 0, data.data(), data.size()).ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(small_importer.fetch(*h, 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
  EXPECT_LE(small_importer.stats().utlb_bytes_registered, 64u * 1024);
  EXPECT_TRUE(region.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Core, Model, testing::ValuesIn(transports), transport_name);

}  // namespace
}  // namespace vmmc::test
