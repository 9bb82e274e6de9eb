// vmmc/core/error.h: the error vocabulary of the whole stack.
//
// Communication paths report errors as values: `vmmc::errc` codes in their own
// std::error_category, carried by `vmmc::result<T>` (a value or an error).
// Upper layers convert only at their edges (errno for sockets, clnt_stat for
// vRPC, NX error codes for nx).
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <cassert>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace vmmc {

enum class errc : int {
  ok = 0,
  invalid_argument = 1,     // a parameter is malformed (null buffer, zero size, bad flags)
  out_of_range = 2,         // offset/length falls outside the imported or exported region
  permission_denied = 3,    // missing right on an import, or the exporter refused the import
  unknown_export = 4,       // the peer has no export by that name
  unknown_handle = 5,       // handle was never issued or has been released
  peer_gone = 6,            // the peer exited, was killed, or the link to it broke
  timed_out = 7,            // the operation's deadline passed
  would_block = 8,          // nothing to do now; drive progress and retry
  protocol_error = 9,       // a peer sent bytes that are not our protocol
  resource_exhausted = 10,  // registration limit, table full, out of memory
  fabric_error = 11,        // libfabric reported an error we cannot map more precisely
  system_error = 12,        // an OS call failed (details in the log)
  already_exists = 13,      // an export of that name is already registered
  unreachable = 14,         // no path (provider, control connection) reaches the peer
  not_connected = 15,       // the channel or socket has no peer yet
  closed = 16,              // this end already closed the direction it is used in
};

// The category's name is "vmmc"; messages are short English sentences.
const std::error_category& vmmc_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), vmmc_category()};
}

// A value of T or an error code. Cheap to move; [[nodiscard]] so that no
// communication error is dropped silently.
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  result(errc e) : state_(make_error_code(e)) { assert(e != errc::ok); }  // NOLINT
  result(std::error_code ec) : state_(ec) { assert(ec); }                 // NOLINT

  bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & {
    assert(has_value());
    return std::get<0>(state_);
  }
  const T& value() const& {
    assert(has_value());
    return std::get<0>(state_);
  }
  T&& value() && {
    assert(has_value());
    return std::get<0>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

  std::error_code error() const noexcept {
    return has_value() ? std::error_code{} : std::get<1>(state_);
  }
  bool is(errc e) const noexcept { return error() == make_error_code(e); }

 private:
  std::variant<T, std::error_code> state_;
};

// The result of an operation that yields nothing but success or an error.
class [[nodiscard]] status {
 public:
  status() = default;
  status(errc e) : ec_(e == errc::ok ? std::error_code{} : make_error_code(e)) {}  // NOLINT
  status(std::error_code ec) : ec_(ec) {}                                          // NOLINT

  bool ok() const noexcept { return !ec_; }
  explicit operator bool() const noexcept { return ok(); }
  std::error_code error() const noexcept { return ec_; }
  bool is(errc e) const noexcept { return ec_ == make_error_code(e); }

 private:
  std::error_code ec_;
};

}  // namespace vmmc

template <>
struct std::is_error_code_enum<vmmc::errc> : std::true_type {};

#pragma GCC visibility pop
