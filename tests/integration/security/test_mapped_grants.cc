// integration.security.mapped_grants: what a same-host importer can do with
// the memfd the mapped path lends it (issue 13, items 4 and 5). The attacker
// is another user speaking the control protocol with raw Unix sockets; the
// victim exports memory from context::allocate as usual, to anyone.
// Before the fix the importer got the whole allocation's memfd, writable
// whatever it was granted, unsealed (truncating it killed the exporter with
// SIGBUS), and it kept writing into the exporter's memory after unexport.
// A silent importer held every unexport up for 2 s (item 7).
// The last case turns it round: a hostile exporter lends the victim a memfd
// it can shrink later; the victim must refuse it.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "integration/security/other_user.h"
#include "integration/security/raw_control.h"
#include "vmmc/core/context.h"

namespace vmmc::test {
namespace {

const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

core::context victim_context() {
  auto c = core::context::create({});
  if (!c) std::abort();
  return std::move(*c);
}

core::export_handle export_to_anyone(core::context& c, const char* name, std::byte* base,
                                     std::size_t length, core::rights allowed) {
  core::export_options o;
  o.allowed = allowed;
  o.policy = core::import_policy::anyone();
  auto e = c.export_buffer(name, base, length, o);
  if (!e) std::abort();
  return *e;
}

bool all_bytes(const std::byte* p, std::size_t n, char value) {
  return std::all_of(p, p + n, [&](std::byte b) { return b == std::byte(value); });
}

// Attacker side: says hello to the victim at `address` and asks for a mapped
// import of `name`. Returns the import reply (its descriptors ours), or a
// frame with header.type 0 when the victim did not answer.
raw::frame import_raw(const std::string& address, const std::string& name, int& control) {
  raw::frame f;
  control = raw::connect_control(address);
  if (control < 0 || !raw::send_hello(control, raw::address_of("attacker", "9")) ||
      !raw::read_frame(control, f) || f.header.type != raw::hello_reply ||
      !raw::send_import_request(control, 1, name) || !raw::read_frame(control, f))
    return {};
  return f;
}

// What a holder of a descriptor lent for a read grant tries, one finding per
// success (empty: the grant held).
std::string try_to_write(int fd) {
  std::string found;
  auto note = [&](const char* what) { found += std::string(what) + "; "; };
  void* w = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (w != MAP_FAILED) note("mapped it writable");
  char byte = 'X';
  if (::pwrite(fd, &byte, 1, 0) == 1) note("wrote it with pwrite");
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  int reopened = ::open(proc.c_str(), O_RDWR | O_CLOEXEC);
  if (reopened >= 0) {
    void* r = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, reopened, 0);
    if (r != MAP_FAILED) note("mapped a reopened descriptor writable");
    ::close(reopened);
  }
  void* ro = ::mmap(nullptr, page, PROT_READ, MAP_SHARED, fd, 0);
  if (ro == MAP_FAILED)
    note("could not even map it readable");
  else if (::mprotect(ro, page, PROT_READ | PROT_WRITE) == 0)
    note("upgraded a mapping to writable");
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, page) == 0)
    note("punched a hole");
  return found;
}

TEST(MappedGrants, AReadGrantCannotBeWrittenResizedOrResealed) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    int control = -1;
    raw::frame reply = import_raw(test.receive(), "secret", control);
    auto r = reply.as<raw::import_reply_body>();
    if (reply.header.type != raw::import_reply || r.status != 0 || !r.mapped ||
        reply.fds.size() != 1)
      return std::string("the read grant was not served on the mapped path");
    const int fd = reply.fds[0];
    std::string found = try_to_write(fd);
    if (::ftruncate(fd, 0) == 0) found += "truncated it; ";
    if (::ftruncate(fd, 64 * page) == 0) found += "grew it; ";
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0) found += "added a seal; ";
    auto* p = static_cast<char*>(::mmap(nullptr, 3 * page, PROT_READ, MAP_SHARED, fd, 0));
    if (p == MAP_FAILED || !all_bytes(reinterpret_cast<std::byte*>(p), 3 * page, 'S'))
      found += "could not read what it was granted; ";
    test.send("done");
    test.receive();  // the victim has looked at its memory
    return found;
  });
  core::context victim = victim_context();
  auto buffer = victim.allocate(3 * page);
  ASSERT_TRUE(buffer);
  std::memset(buffer->data(), 'S', 3 * page);
  export_to_anyone(victim, "secret", buffer->data(), 3 * page, core::rights::read);
  attacker.link().send(victim.address());
  EXPECT_EQ(attacker.link().receive(), "done");
  // Reading every byte would die of SIGBUS had the memfd been truncated.
  EXPECT_TRUE(all_bytes(buffer->data(), 3 * page, 'S')) << "the victim's memory changed";
  attacker.link().send("looked");
  EXPECT_EQ(attacker.finish(), "");
}

TEST(MappedGrants, AnImporterGetsOnlyTheExportedPages) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    const std::string address = test.receive();
    std::string found;
    int control = -1;
    raw::frame reply = import_raw(address, "middle", control);
    auto r = reply.as<raw::import_reply_body>();
    if (reply.header.type != raw::import_reply || r.status != 0 || !r.mapped ||
        reply.fds.size() != 1)
      return std::string("the page-aligned window was not served on the mapped path");
    struct stat st {};
    if (::fstat(reply.fds[0], &st) != 0 || static_cast<std::size_t>(st.st_size) != page)
      found += "the lent memfd holds " + std::to_string(st.st_size) + " bytes, not one page; ";
    char past;
    if (::pread(reply.fds[0], &past, 1, static_cast<off_t>(page)) != 0)
      found += "read a byte past the window; ";
    auto* p = static_cast<char*>(
        ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, reply.fds[0], 0));
    if (p == MAP_FAILED) return found + "could not map the window it was granted";
    if (p[0] != 'B') found += "the window does not hold the exported page; ";
    std::memset(p, 'W', page);  // granted: lands in the victim's page 1

    // A window that shares its pages with other bytes is not lent at all.
    int control2 = -1;
    reply = import_raw(address, "unaligned", control2);
    if (!reply.fds.empty()) found += "got a descriptor for an unaligned window; ";
    test.send("done");
    test.receive();
    return found;
  });
  core::context victim = victim_context();
  auto buffer = victim.allocate(3 * page);
  ASSERT_TRUE(buffer);
  std::byte* b = buffer->data();
  std::memset(b, 'A', page);
  std::memset(b + page, 'B', page);
  std::memset(b + 2 * page, 'C', page);
  export_to_anyone(victim, "middle", b + page, page, core::rights::read_write);
  export_to_anyone(victim, "unaligned", b + 2 * page + 100, 200, core::rights::read_write);
  attacker.link().send(victim.address());
  EXPECT_EQ(attacker.link().receive(), "done");
  EXPECT_TRUE(all_bytes(b, page, 'A')) << "a byte before the window changed";
  EXPECT_TRUE(all_bytes(b + page, page, 'W')) << "the granted write did not land";
  EXPECT_TRUE(all_bytes(b + 2 * page, page, 'C')) << "a byte after the window changed";
  attacker.link().send("looked");
  EXPECT_EQ(attacker.finish(), "");
}

TEST(MappedGrants, UnexportCutsOffAnImporterThatIgnoresTheRevoke) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    int control = -1;
    raw::frame reply = import_raw(test.receive(), "inbox", control);
    if (reply.header.type != raw::import_reply || reply.fds.size() != 1)
      return std::string("the write grant was not served on the mapped path");
    auto* p = static_cast<char*>(
        ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, reply.fds[0], 0));
    if (p == MAP_FAILED) return std::string("could not map the window it was granted");
    p[1] = 'W';  // granted
    test.send("mapped");
    // The revoke arrives; we neither acknowledge it nor unmap, and write on,
    // through the old mapping and through a new one.
    if (test.receive() != "unexported") return std::string("lost the test");
    std::memset(p + 2, 'Z', page - 2);
    auto* again = static_cast<char*>(
        ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, reply.fds[0], 0));
    if (again != MAP_FAILED) std::memset(again + 2, 'Z', page - 2);
    test.send("done");
    test.receive();
    return std::string();
  });
  core::context victim = victim_context();
  auto buffer = victim.allocate(page);
  ASSERT_TRUE(buffer);
  std::byte* b = buffer->data();
  std::memset(b, 'P', page);
  auto e = export_to_anyone(victim, "inbox", b, page, core::rights::write);
  attacker.link().send(victim.address());
  ASSERT_EQ(attacker.link().receive(), "mapped");
  // Enforced by moving the pages, unexport needs no word from a same-host
  // importer: a silent one must not hold it up (before: 2 s each).
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(victim.unexport_buffer(e).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_EQ(b[1], std::byte('W')) << "a write made under the grant was lost at unexport";
  attacker.link().send("unexported");
  EXPECT_EQ(attacker.link().receive(), "done");
  EXPECT_EQ(b[0], std::byte('P'));
  EXPECT_TRUE(all_bytes(b + 2, page - 2, 'P')) << "a write after unexport reached the memory";
  // The memory stays the victim's own: it can write it and export it again.
  std::memset(b, 'Q', page);
  core::export_options o;
  EXPECT_TRUE(victim.export_buffer("inbox", b, page, o));
  attacker.link().send("looked");
  EXPECT_EQ(attacker.finish(), "");
}

TEST(MappedGrants, AnImporterRefusesAMemfdItsExporterCouldShrink) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process exporter([](line_channel& test) {
    // Pose as a same-host context: listen where the victim will look for us.
    std::string why;
    int s = raw::pose_as_exporter(
        test.receive(), "4242", [&](const std::string& a) { test.send(a); }, why);
    if (s < 0) return why;
    raw::frame f;
    if (!raw::read_frame(s, f) || f.header.type != raw::hello) return std::string("no hello");
    // Unsealed memfds, sized right, for the wake page, the ring and the window.
    auto memfd = [](std::size_t bytes) {
      int fd = ::memfd_create("hostile", MFD_CLOEXEC);
      return fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? fd : -1;
    };
    const int wake = memfd(page), ring = memfd(16 * page), window = memfd(page);
    const int event = ::eventfd(0, EFD_CLOEXEC);
    raw::hello_reply_body hr{0, 1};
    if (!raw::send_frame(s, raw::hello_reply, &hr, sizeof hr, {wake, event, ring}))
      return std::string("could not answer the hello");
    // If the victim still asks for an import, answer it with the window, then
    // shrink everything: its next copy would die of SIGBUS.
    if (raw::read_frame(s, f, 3000) && f.header.type == raw::import_request) {
      raw::import_reply_body r{};
      r.request_id = f.as<raw::import_request_body>().request_id;
      r.export_id = 1;
      r.length = page;
      r.rights = 3;
      r.mapped = 1;
      (void)raw::send_frame(s, raw::import_reply, &r, sizeof r, {window});
    }
    test.receive();  // the victim's import has returned
    for (int fd : {wake, ring, window}) (void)::ftruncate(fd, 0);
    test.send("shrunk");
    test.receive();
    return std::string();
  });
  core::context victim = victim_context();
  exporter.link().send(victim.address());
  const std::string hostile = exporter.link().receive();
  ASSERT_FALSE(hostile.empty());
  auto h = victim.import_buffer(hostile, "anything", std::chrono::seconds(3));
  exporter.link().send("imported");
  ASSERT_EQ(exporter.link().receive(), "shrunk");
  if (h) {  // its next send would die of SIGBUS: fail here instead
    ADD_FAILURE() << "the victim accepted a memfd its exporter can shrink";
  } else {
    EXPECT_TRUE(h.is(errc::protocol_error)) << h.error().message();
  }
  exporter.link().send("over");
  EXPECT_EQ(exporter.finish(), "");
}

}  // namespace
}  // namespace vmmc::test
