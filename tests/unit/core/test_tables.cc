// unit.core.tables: the tables context::impl is made of (core/src/exports.h,
// links.h, id_table.h), each with its own lock, by their contracts: a name
// is taken once, ids are never reused, and an export's withdrawal waits for
// the importers that may still write into it, and for no one else.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "core.h"

namespace vmmc::test {
namespace {

using namespace std::chrono_literals;
using core::detail::export_entry;
using core::detail::export_table;
using core::detail::importer_link;
using core::detail::link_table;

std::shared_ptr<export_entry> entry(const char* name) {
  auto e = std::make_shared<export_entry>();
  e->name = name;
  return e;
}

TEST(Tables, AnExportNameIsTakenOnceAndFreedByTheWithdrawal) {
  export_table t;
  auto a = entry("a"), again = entry("a");
  ASSERT_TRUE(t.add(a));
  EXPECT_FALSE(t.add(again)) << "a taken name";
  EXPECT_EQ(again->id, 0u) << "a refused export is given no id";
  EXPECT_EQ(t.find("a"), a);
  EXPECT_EQ(t.find(a->id), a);
  EXPECT_EQ(t.ids(), std::vector<std::uint32_t>{a->id});
  EXPECT_EQ(t.remove(a->id), a);
  EXPECT_EQ(t.remove(a->id), nullptr);
  EXPECT_EQ(t.find("a"), nullptr);
  ASSERT_TRUE(t.add(again)) << "the name is free again";
  EXPECT_NE(again->id, a->id) << "ids are never reused";
}

TEST(Tables, ARequestIsFoundUntilItIsReportedAndItsIdNeverComesBack) {
  core::detail::id_table<core::detail::op> t;
  const std::uint64_t first = t.add(std::make_shared<core::detail::op>());
  EXPECT_NE(t.find(first), nullptr);
  t.remove(first);
  EXPECT_EQ(t.find(first), nullptr);
  EXPECT_NE(t.add(std::make_shared<core::detail::op>()), first);
  // An import records its id before another thread can find it.
  core::detail::id_table<core::detail::import_entry> imports;
  auto imp = std::make_shared<core::detail::import_entry>();
  const std::uint64_t id =
      imports.add(imp, [](core::detail::import_entry& i, std::uint64_t given) { i.id = given; });
  EXPECT_EQ(imp->id, id);
  EXPECT_EQ(imports.find(id), imp);
  EXPECT_EQ(imports.remove(id), imp);
  EXPECT_EQ(imports.remove(id), nullptr);
}

// A link over one end of a socket pair; the test holds the other.
struct test_link {
  std::shared_ptr<importer_link> link = std::make_shared<importer_link>();
  int importer_end = -1;
  test_link() {
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) std::abort();
    link->conn = std::make_unique<core::detail::connection>(core::detail::unique_fd(ends[0]), true);
    importer_end = ends[1];
  }
  ~test_link() { ::close(importer_end); }
};

TEST(Tables, AWithdrawalWaitsForTheImportersOverTheFabricOnly) {
  link_table links;
  test_link fabric, mapped, other;
  for (auto* l : {&fabric, &mapped, &other}) links.add(l->link, 16);
  auto e = entry("shared");
  e->id = 7;
  auto unrelated = entry("unrelated");
  unrelated->id = 8;
  int answers = 0;
  auto answer = [&](bool granted) { answers += granted; };
  ASSERT_TRUE(links.grant(*fabric.link, *e, true, answer));
  ASSERT_TRUE(links.grant(*mapped.link, *e, false, answer));
  ASSERT_TRUE(links.grant(*other.link, *unrelated, true, answer));
  EXPECT_EQ(answers, 3);
  EXPECT_TRUE(links.may_notify(*fabric.link, e->id));
  EXPECT_FALSE(links.may_notify(*other.link, e->id));

  // Only the fabric importer's acknowledgement is waited for.
  std::thread importer([&] {
    std::this_thread::sleep_for(50ms);
    links.acknowledge(*fabric.link, e->id);
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(links.revoke(*e, 5s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 40ms);
  importer.join();
  EXPECT_FALSE(links.may_notify(*fabric.link, e->id)) << "no link holds a grant of it after";
  EXPECT_FALSE(links.may_notify(*mapped.link, e->id));
  EXPECT_TRUE(links.may_notify(*other.link, unrelated->id)) << "other exports keep theirs";

  // An importer that never answers is waited for no longer than asked.
  ASSERT_TRUE(links.grant(*fabric.link, *unrelated, true, answer));
  const auto silent = std::chrono::steady_clock::now();
  EXPECT_FALSE(links.revoke(*unrelated, 100ms));
  EXPECT_LT(std::chrono::steady_clock::now() - silent, 2s);
}

TEST(Tables, AReleaseOrALinkThatEndsSettlesAWithdrawal) {
  link_table links;
  test_link released, ended;
  links.add(released.link, 16);
  links.add(ended.link, 16);
  auto e = entry("e");
  e->id = 1;
  auto ignore = [](bool) {};
  ASSERT_TRUE(links.grant(*released.link, *e, true, ignore));
  ASSERT_TRUE(links.grant(*ended.link, *e, true, ignore));
  std::thread importers([&] {
    std::this_thread::sleep_for(30ms);
    links.release(*released.link, e->id);  // its last import of e: as good as an ack
    std::this_thread::sleep_for(30ms);
    ended.link->alive = false;
    std::vector<core::notification> unread;
    links.remove(ended.link, unread);
  });
  EXPECT_TRUE(links.revoke(*e, 5s));
  importers.join();
}

TEST(Tables, AnExportWithdrawnBeforeItsGrantIsNotGranted) {
  link_table links;
  test_link l;
  links.add(l.link, 16);
  auto e = entry("gone");
  e->id = 3;
  e->live = false;
  bool told = true;
  EXPECT_FALSE(links.grant(*l.link, *e, true, [&](bool granted) { told = granted; }));
  EXPECT_FALSE(told) << "the importer is answered that it is gone";
  EXPECT_FALSE(links.may_notify(*l.link, e->id));
}

TEST(Tables, AFloodOfHalfOpenLinksAgesOutTheOldestFirst) {
  link_table links;
  test_link a, b, c;
  a.link->accepted_ns = 1;
  b.link->accepted_ns = 2;
  c.link->accepted_ns = 3;
  links.add(a.link, 2);
  links.add(b.link, 2);
  EXPECT_TRUE(a.link->alive && b.link->alive);
  links.add(c.link, 2);
  EXPECT_FALSE(a.link->alive) << "the oldest without a hello goes";
  EXPECT_TRUE(b.link->alive && c.link->alive);
  links.drop_oldest_half_open();
  EXPECT_FALSE(b.link->alive);
  EXPECT_TRUE(c.link->alive);
}

}  // namespace
}  // namespace vmmc::test
