// Fuzz target fuzz.core.address: address blobs (decode_address), as a peer
// hands them over in a hello or upper layers pass them in-band. An accepted
// blob must survive encode_address and decode to the same value.
#include <cstdint>

#include "core.h"
#include "fuzz_check.h"

using namespace vmmc::core::detail;
using vmmc::fuzz::check;

namespace {
// The digits the blob gave for `key` (its last field of that key), leading
// zeros dropped: what the decoded number must print as, not a wrapped or
// truncated value.
std::string digits_of(std::string_view text, std::string_view key) {
  std::string_view last;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = std::min(text.find(';', pos + 1), text.size());
    std::string_view field = text.substr(pos + 1, end - pos - 1);
    if (field.size() > key.size() && field.substr(0, key.size()) == key && field[key.size()] == '=')
      last = field.substr(key.size() + 1);
    pos = end;
  }
  std::string d(last);
  d.erase(0, std::min(d.find_first_not_of('0'), d.size() - 1));
  return d;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto a = decode_address(text);
  if (!a) return 0;
  check(size <= 4096);
  check(!a->host.empty());
  for (const auto& [provider, bytes] : a->fabric) check(!bytes.empty());
  check(std::to_string(a->pid) == digits_of(text, "p"));
  check(std::to_string(a->uid) == digits_of(text, "u"));
  check(std::to_string(a->nonce) == digits_of(text, "n"));
  const std::string again = encode_address(*a);
  auto b = decode_address(again);
  check(static_cast<bool>(b));
  check(b->host == a->host && b->pid == a->pid && b->uid == a->uid && b->nonce == a->nonce &&
        b->control_tcp == a->control_tcp && b->fabric == a->fabric);
  check(encode_address(*b) == again);
  return 0;
}
