// vmmc/core/settings.h: runtime settings, declared once per layer.
//
// Each layer declares a table of settings (name, type, default, help). A value
// comes from the environment variable VMMC_<LAYER>_<NAME> or else the default.
// `vmmc-settings` prints every registered table with current values. Every
// VMMC_* variable the code reads is a setting read through these calls (a
// test greps the sources for others): internal ones, which vmmc sets for the
// processes it starts, are declared too and listed apart.
// Thread safety: tables are registered during static initialisation; reads
// are safe from any thread.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vmmc::core {

enum class setting_type { boolean, integer, bytes, string };

struct setting {
  std::string_view layer;  // "core", "sockets", ...
  std::string_view name;   // "utlb_limit"
  setting_type type;
  std::string_view default_value;  // as it would be written in the environment
  std::string_view help;
  bool internal = false;  // set by vmmc for processes it starts (a launcher, exec), not by users
};

// "VMMC_CORE_UTLB_LIMIT" for {core, utlb_limit}.
std::string environment_name(const setting& s);
// The raw text: the environment's value, else the default.
std::string setting_text(const setting& s);
// True when the environment gives a value (even the default's).
bool setting_given(const setting& s);
// Typed reads. Malformed values fall back to the default and are reported on
// stderr once. bytes accepts suffixes k, m, g (powers of 1024).
bool setting_bool(const setting& s);
std::int64_t setting_integer(const setting& s);
std::string setting_string(const setting& s);

// Makes a table visible to list_settings(). Call once per table (a static
// registrar object beside the table does it).
void register_settings(std::span<const setting> table);
std::vector<setting> list_settings();

// The core layer's own table.
namespace settings {
extern const setting providers;
extern const setting mapped_path;
extern const setting utlb_limit;
extern const setting inline_max;
extern const setting tcp_address;
extern const setting liveness_ms;
extern const setting spin_us;
extern const setting log_level;
extern const setting user_key;
}  // namespace settings

}  // namespace vmmc::core

#pragma GCC visibility pop
