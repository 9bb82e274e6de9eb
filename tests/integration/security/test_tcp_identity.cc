// integration.security.tcp_identity: another user says hello over the
// victim's TCP control listener (the one peers on other hosts use) with raw
// sockets, claiming an identity it does not have (issue 13, item 3). Before
// the fix the hello's uid was taken on trust (a same_user export was
// imported by a uid claim) and a named_peers export admitted anyone who
// replayed the named peer's address string. Now a TCP hello is challenged:
// the importer must prove its context's secret (only the peers it handed its
// address to know it) and, for "same user", the user key.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "integration/security/other_user.h"
#include "integration/security/raw_control.h"
#include "user_key.h"
#include "vmmc/core/context.h"

namespace vmmc::test {
namespace {

VMMC_TEST_TEMPORARY_USER_KEY;

constexpr std::uint16_t frame_hello_challenge = 9, frame_hello_proof = 10;
struct hello_proof_body {
  std::uint8_t context_proof[32], user_proof[32];
  std::uint32_t has_user_proof, reserved;
};
constexpr std::uint32_t status_permission_denied = 3;  // vmmc::errc

// The victim's TCP control listener, from its address (";c=ip:port").
int connect_tcp_control(const std::string& address) {
  const std::string at = raw::field(address, "c");
  auto colon = at.rfind(':');
  if (colon == std::string::npos) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(at.substr(colon + 1))));
  if (::inet_pton(AF_INET, at.substr(0, colon).c_str(), &a.sin_addr) != 1) return -1;
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

// The address without its secret: what a hello carries, and what anyone
// the named peer ever said hello to has seen.
std::string public_part(const std::string& address) {
  auto k = address.find(";k=");
  return k == std::string::npos ? address : address.substr(0, k);
}

// Says hello over TCP as `claimed_uid` with `blob`, answers the challenge
// with made-up proofs, and imports `name`. Returns the import's status, or
// a description of what went differently.
std::string import_claiming(const std::string& victim, const std::string& blob,
                            std::uint32_t claimed_uid, const std::string& name) {
  int s = connect_tcp_control(victim);
  if (s < 0) return "no TCP control listener";
  std::vector<char> hello(sizeof(raw::hello_body) + blob.size());
  raw::hello_body hb{claimed_uid, static_cast<std::uint32_t>(::getpid()),
                     static_cast<std::uint32_t>(blob.size())};
  std::memcpy(hello.data(), &hb, sizeof hb);
  std::memcpy(hello.data() + sizeof hb, blob.data(), blob.size());
  raw::frame f;
  if (!raw::send_frame(s, raw::hello, hello.data(), hello.size()) || !raw::read_frame(s, f))
    return "hello refused";
  if (f.header.type == frame_hello_challenge) {
    hello_proof_body proof{};
    std::memset(proof.context_proof, 0x5a, sizeof proof.context_proof);  // a guess
    std::memset(proof.user_proof, 0x5a, sizeof proof.user_proof);
    proof.has_user_proof = 1;
    if (!raw::send_frame(s, frame_hello_proof, &proof, sizeof proof) || !raw::read_frame(s, f))
      return "proof refused";
  }
  if (f.header.type != raw::hello_reply) return "no hello reply";
  if (!raw::send_import_request(s, 1, name) || !raw::read_frame(s, f)) return "no import reply";
  ::close(s);
  return "status " + std::to_string(f.as<raw::import_reply_body>().status);
}

TEST(TcpIdentity, AClaimedUidIsNotTheSameUser) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    const std::string victim = test.receive();
    // Its own context's address (a made-up one on the victim's host, which
    // it is on), claiming the victim's uid.
    const std::string me = raw::address_of(raw::field(victim, "h"), "31");
    const std::string got = import_claiming(
        victim, me, static_cast<std::uint32_t>(std::stoul(raw::field(victim, "u"))), "mine");
    return got == "status " + std::to_string(status_permission_denied)
               ? std::string()
               : "claiming the victim's uid got: " + got;
  });
  auto victim = core::context::create({});
  ASSERT_TRUE(victim) << victim.error().message();
  std::vector<std::byte> memory(4096);
  ASSERT_TRUE(victim->export_buffer("mine", memory.data(), memory.size()));  // same_user
  attacker.link().send(victim->address());
  EXPECT_EQ(attacker.finish(), "");
}

TEST(TcpIdentity, AReplayedAddressIsNotTheNamedPeer) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    const std::string victim = test.receive();
    const std::string named = test.receive();  // public: seen in a hello of the named peer
    const std::string got = import_claiming(victim, named, ::getuid(), "named");
    return got == "status " + std::to_string(status_permission_denied)
               ? std::string()
               : "replaying the named peer's address got: " + got;
  });
  auto victim = core::context::create({});
  auto friend_context = core::context::create({});
  ASSERT_TRUE(victim && friend_context);
  std::vector<std::byte> memory(4096);
  core::export_options o;
  o.policy = core::import_policy::only({friend_context->address()});
  ASSERT_TRUE(victim->export_buffer("named", memory.data(), memory.size(), o));
  // The friend itself, over the same-host path, is admitted.
  EXPECT_TRUE(friend_context->import_buffer(victim->address(), "named"));
  attacker.link().send(victim->address());
  attacker.link().send(public_part(friend_context->address()));
  EXPECT_EQ(attacker.finish(), "");
}

}  // namespace
}  // namespace vmmc::test
