// The "vmmc" error category: messages for vmmc::errc.
#include "vmmc/core/error.h"

namespace vmmc {
namespace {
class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "vmmc"; }
  std::string message(int code) const override {
    switch (static_cast<errc>(code)) {
      case errc::ok:
        return "success";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::out_of_range:
        return "offset or length outside the region";
      case errc::permission_denied:
        return "permission denied";
      case errc::unknown_export:
        return "no export by that name";
      case errc::unknown_handle:
        return "unknown or released handle";
      case errc::peer_gone:
        return "peer is gone";
      case errc::timed_out:
        return "timed out";
      case errc::would_block:
        return "operation would block";
      case errc::protocol_error:
        return "protocol error";
      case errc::resource_exhausted:
        return "resources exhausted";
      case errc::fabric_error:
        return "fabric error";
      case errc::system_error:
        return "system call failed";
      case errc::already_exists:
        return "already exists";
      case errc::unreachable:
        return "peer unreachable";
      case errc::not_connected:
        return "not connected";
      case errc::closed:
        return "already closed";
    }
    return "unknown vmmc error";
  }
};
}  // namespace

// Never destroyed: a control thread may still compare error codes while the
// process runs its static destructors (seen under UBSan: a preloaded
// pre-forking server's child exiting while its control thread parsed a
// frame, against a category whose vptr was already gone).
const std::error_category& vmmc_category() noexcept {
  static const category& instance = *new category;
  return instance;
}
}  // namespace vmmc
