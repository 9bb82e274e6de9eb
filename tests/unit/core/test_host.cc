// unit.core.host: core::host_identity, the one definition of "this host"
// (vmmc/core/host.h): the boot id and the network namespace, never the host
// name.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

#include "vmmc/core/host.h"

namespace vmmc::core {
namespace {

TEST(Host, LocalIsTheBootIdAndTheNetworkNamespace) {
  host_identity id = host_identity::local();
  std::string boot;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
  std::string without_dashes;
  for (char c : boot)
    if (c != '-') without_dashes += c;
  EXPECT_EQ(id.kernel, without_dashes);
  EXPECT_EQ(id.kernel.size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat("/proc/self/ns/net", &st), 0);
  EXPECT_EQ(id.network, std::to_string(st.st_ino));
  EXPECT_TRUE(id.same_host(host_identity::local()));
}

TEST(Host, TextRoundTripsAndParseRefusesWhatTextCannotMake) {
  host_identity id = host_identity::local();
  auto back = host_identity::parse(id.text());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kernel, id.kernel);
  EXPECT_EQ(back->network, id.network);
  for (const char* bad : {"", ".", "abc", "abc.", "myhost", "ab-cd.12", "abc.12x", "ABC.12",
                          "abc.1.2", "abc.123456789012345678901"})
    EXPECT_FALSE(host_identity::parse(bad)) << bad;
  // Where the boot id cannot be read, text() makes ".<namespace>".
  auto unread = host_identity::parse(host_identity{"", "42"}.text());
  ASSERT_TRUE(unread);
  EXPECT_TRUE(unread->same_host({"", "42"}));
}

TEST(Host, SameKernelAndNamespaceIsOneHost) {
  host_identity a{"00ff", "10"};
  EXPECT_TRUE(a.same_host({"00ff", "10"}));
  EXPECT_FALSE(a.same_host({"00ff", "11"}));   // a container, a simulated host
  EXPECT_TRUE(a.same_kernel({"00ff", "11"}));  // ... on the same CPUs
  EXPECT_FALSE(a.same_kernel({"00fe", "10"}));
}

// A process that enters a new network namespace is on another host that
// shares this one's kernel; the host name it keeps says nothing.
TEST(Host, ANewNetworkNamespaceIsAnotherHostOnTheSameKernel) {
  const host_identity outside = host_identity::local();
  int to_parent[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char result = 's';  // skipped: not allowed to make namespaces here
    if (::unshare(CLONE_NEWNET) == 0) {
      host_identity inside = host_identity::local();
      result = !inside.same_host(outside) && inside.same_kernel(outside) ? 'y' : 'n';
    }
    (void)!::write(to_parent[1], &result, 1);
    _exit(0);
  }
  ::close(to_parent[1]);
  char result = 0;
  EXPECT_EQ(::read(to_parent[0], &result, 1), 1);
  ::close(to_parent[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (result == 's') GTEST_SKIP() << "cannot create a network namespace here";
  EXPECT_EQ(result, 'y');
}

}  // namespace
}  // namespace vmmc::core
