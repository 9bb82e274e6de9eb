// core/src/address.h: what a context's address says (address.cc), and
// where such an address may be trusted from.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vmmc/core/context.h"

namespace vmmc::core::detail {

struct peer_address {
  std::string host;  // host_identity::text(): equal means "same host"
  std::uint32_t pid = 0;
  std::uint32_t uid = 0;
  std::uint64_t nonce = 0;  // distinguishes contexts (and pid reuse)
  std::string control_tcp;  // "ip:port" of the TCP control listener, may be empty
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> fabric;  // short provider name
  // The context's secret (";k="), in the addresses it hands out itself only:
  // never in a hello. Proves over TCP that a hello comes from this context.
  std::vector<std::uint8_t> secret;
  bool same_context(const peer_address& o) const {
    return host == o.host && pid == o.pid && nonce == o.nonce;
  }

  const std::vector<std::uint8_t>* fabric_for(std::string_view provider) const {
    for (const auto& [name, bytes] : fabric)
      if (name == provider) return &bytes;
    return nullptr;
  }
};
std::uint64_t random_nonce();
// The public address (no secret): what a hello carries.
std::string encode_address(const peer_address& a);
// What a context hands out: the public address and its secret.
std::string encode_address_with_secret(const peer_address& a);
// Whether `claimed`, handed to us in-band over a kernel connection whose other
// end is `other_end` (a sockaddr), points back at that end (see
// context::check_address_from).
status check_points_back(const std::string& our_host, const peer_address& claimed,
                         const void* other_end, std::size_t length);
result<peer_address> decode_address(std::string_view text);
std::string control_socket_name(std::uint32_t pid, std::uint64_t nonce);

}  // namespace vmmc::core::detail
