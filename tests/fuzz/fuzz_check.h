// fuzz_check.h: what every fuzz target here uses: an invariant check that
// stops the run (libFuzzer saves the input), and a reader that takes typed
// values off the front of the input (zeros once it runs out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace vmmc::fuzz {

// A violated invariant is a crash: libFuzzer reports it and keeps the input.
inline void check(bool holds) {
  if (!holds) __builtin_trap();
}

class input {
 public:
  input(const std::uint8_t* data, std::size_t size) : bytes_(data, size) {}

  template <class T>
  T take() {
    T value{};
    const std::size_t n = std::min(sizeof value, bytes_.size());
    if (n) std::memcpy(&value, bytes_.data(), n);
    bytes_ = bytes_.subspan(n);
    return value;
  }
  std::span<const std::uint8_t> take_bytes(std::size_t n) {
    auto part = bytes_.first(std::min(n, bytes_.size()));
    bytes_ = bytes_.subspan(part.size());
    return part;
  }
  std::span<const std::uint8_t> rest() const { return bytes_; }
  std::string_view rest_text() const {
    return {reinterpret_cast<const char*>(bytes_.data()), bytes_.size()};
  }

 private:
  std::span<const std::uint8_t> bytes_;
};

}  // namespace vmmc::fuzz
