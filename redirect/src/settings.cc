// The redirect layer's settings: VMMC_REDIRECT_<NAME>.
#include "settings.h"

namespace vmmc::redirect::settings {
using core::setting;
using core::setting_type;
// clang-format off
const setting ring_bytes {"redirect", "ring_bytes", setting_type::bytes, "2m",
  "default buffer (ring) of each channel end; rounded up to a power of two"};
const setting post_min   {"redirect", "post_min",   setting_type::bytes, "64k",
  "smallest receive that posts its buffer for direct placement (fabric path only)"};
// clang-format on

namespace {
const setting table[] = {ring_bytes, post_min};
struct registrar {
  registrar() { core::register_settings(table); }
} const register_once;
}  // namespace
}  // namespace vmmc::redirect::settings
