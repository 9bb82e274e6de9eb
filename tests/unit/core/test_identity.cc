// unit.core.identity: the keyed hash behind the TCP hello's proofs
// (core/src/identity.cc) against RFC 4231's HMAC-SHA-256 test cases, and the
// proofs' binding to every input.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core.h"

namespace vmmc::core::detail {
namespace {

std::string hex(const digest& d) {
  std::string s;
  char b[3];
  for (std::uint8_t byte : d) {
    std::snprintf(b, sizeof b, "%02x", byte);
    s += b;
  }
  return s;
}

std::vector<std::uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

TEST(Identity, HmacSha256MatchesRfc4231) {
  // Test case 1: a 20-byte key.
  EXPECT_EQ(hex(hmac_sha256(std::vector<std::uint8_t>(20, 0x0b), bytes("Hi There"))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  EXPECT_EQ(hex(hmac_sha256(bytes("Jefe"), bytes("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than a block (hashed first).
  EXPECT_EQ(hex(hmac_sha256(std::vector<std::uint8_t>(131, 0xaa),
                            bytes("Test Using Larger Than Block-Size Key - Hash Key First"))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Identity, ProofsDependOnEveryInput) {
  const std::vector<std::uint8_t> secret(16, 1), other_secret(16, 2), challenge(16, 3),
      other_challenge(16, 4);
  const digest p = context_proof(secret, challenge, 7);
  EXPECT_TRUE(same_digest(p, context_proof(secret, challenge, 7)));
  EXPECT_FALSE(same_digest(p, context_proof(other_secret, challenge, 7)));
  EXPECT_FALSE(same_digest(p, context_proof(secret, other_challenge, 7)));
  EXPECT_FALSE(same_digest(p, context_proof(secret, challenge, 8)));
  const digest u = user_proof(secret, challenge, 7, 1000);
  EXPECT_FALSE(same_digest(u, user_proof(secret, challenge, 7, 1001)));
  EXPECT_FALSE(same_digest(u, p));  // a context proof is never a user proof
}

}  // namespace
}  // namespace vmmc::core::detail
