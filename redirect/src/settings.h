// redirect/src/settings.h: the redirect layer's settings table.
#pragma once

#include "vmmc/core/settings.h"

namespace vmmc::redirect::settings {
extern const core::setting ring_bytes;
extern const core::setting post_min;
}  // namespace vmmc::redirect::settings
