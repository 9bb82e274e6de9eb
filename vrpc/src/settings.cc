// The vrpc layer's settings table (VMMC_VRPC_*; `vmmc-settings` lists them).
#include "vrpc_impl.h"

namespace vmmc::vrpc::detail::settings {
// clang-format off
const core::setting io_timeout_ms {"vrpc", "io_timeout_ms", core::setting_type::integer, "5000",
  "a server gives up on a connection whose call stops arriving mid-record, or whose client stops "
  "taking its reply, after this long (milliseconds)"};
// clang-format on
namespace {
const core::setting table[] = {io_timeout_ms};
struct registrar {
  registrar() { core::register_settings(table); }
} const register_once;
}  // namespace
}  // namespace vmmc::vrpc::detail::settings
