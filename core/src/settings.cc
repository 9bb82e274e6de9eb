// Settings: one table per layer, read from VMMC_<LAYER>_<NAME>.
#include "vmmc/core/settings.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace vmmc::core {
namespace settings {
// clang-format off
const setting providers   {"core", "providers",   setting_type::string,  "shm,tcp",
  "libfabric providers to open, comma separated (shm, tcp = tcp;ofi_rxm, verbs, efa, ...)"};
const setting mapped_path {"core", "mapped",      setting_type::boolean, "1",
  "same-host importers map exported memory and copy at user level"};
const setting utlb_limit  {"core", "utlb_limit",  setting_type::bytes,   "1g",
  "most bytes the registration cache (UTLB) keeps registered; LRU entries are evicted beyond it"};
const setting inline_max  {"core", "inline_max",  setting_type::bytes,   "4k",
  "sends up to this size are copied (inline) instead of sent zero-copy from registered memory"};
const setting tcp_address {"core", "tcp_address", setting_type::string,  "",
  "local IPv4 address remote peers reach the tcp provider and the control listener at; empty: "
  "the one the layer above names (sockets: the connection's local address; NX: the default "
  "route's interface, in jobs that span hosts), else 127.0.0.1"};
const setting liveness_ms {"core", "liveness_ms", setting_type::integer, "0",
  "0: like kernel TCP, a peer on another host is gone only when its control connection ends "
  "(reset, end, the kernel's retransmission timeout); N > 0: also when heartbeats stay "
  "unacknowledged for N ms (TCP_USER_TIMEOUT). A stopped but reachable peer is never gone"};
const setting spin_us     {"core", "spin_us",     setting_type::integer, "200",
  "how long waits busy-poll before sleeping on a descriptor"};
const setting log_level   {"core", "log_level",   setting_type::integer, "0",
  "0 silent, 1 errors, 2 warnings, 3 debug (on stderr)"};
const setting user_key    {"core", "user_key",    setting_type::string,  "",
  "file with this user's key, which proves 'same user' to peers on other hosts "
  "(empty: ~/.vmmc/user-key, made on first use; hosts must share it)"};
// clang-format on

const setting table[] = {providers,   mapped_path, utlb_limit, inline_max, tcp_address,
                         liveness_ms, spin_us,     log_level,  user_key};
}  // namespace settings

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<setting>& registry() {
  static std::vector<setting> all;
  return all;
}
struct core_registrar {
  core_registrar() { register_settings(settings::table); }
} const register_core;

void warn_malformed(const setting& s, const std::string& text) {
  std::fprintf(stderr, "vmmc: %s=\"%s\" is not a valid %s; using default \"%.*s\"\n",
               environment_name(s).c_str(), text.c_str(),
               s.type == setting_type::boolean ? "boolean" : "number",
               static_cast<int>(s.default_value.size()), s.default_value.data());
}

// Parses "123", "-1" (integers), "64k", "1g" (bytes). Returns false on
// anything else.
bool parse_number(std::string_view text, bool allow_suffix, std::int64_t& out) {
  const bool negative = !allow_suffix && !text.empty() && text[0] == '-';
  if (negative) text.remove_prefix(1);
  if (text.empty()) return false;
  std::size_t i = 0;
  std::int64_t v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    v = v * 10 + (text[i] - '0');
    ++i;
  }
  if (i == 0) return false;
  if (i < text.size()) {
    if (!allow_suffix || i + 1 != text.size()) return false;
    switch (std::tolower(static_cast<unsigned char>(text[i]))) {
      case 'k':
        v <<= 10;
        break;
      case 'm':
        v <<= 20;
        break;
      case 'g':
        v <<= 30;
        break;
      default:
        return false;
    }
  }
  out = negative ? -v : v;
  return true;
}
}  // namespace

std::string environment_name(const setting& s) {
  std::string n = "VMMC_";
  for (char c : s.layer) n += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  n += '_';
  for (char c : s.name) n += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return n;
}

std::string setting_text(const setting& s) {
  const char* v = std::getenv(environment_name(s).c_str());
  return v ? std::string(v) : std::string(s.default_value);
}

bool setting_given(const setting& s) {
  return std::getenv(environment_name(s).c_str()) != nullptr;
}

bool setting_bool(const setting& s) {
  std::string t = setting_text(s);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "1" || t == "yes" || t == "on" || t == "true") return true;
  if (t == "0" || t == "no" || t == "off" || t == "false") return false;
  warn_malformed(s, t);
  return s.default_value == "1";
}

std::int64_t setting_integer(const setting& s) {
  std::string t = setting_text(s);
  std::int64_t v = 0;
  if (parse_number(t, s.type == setting_type::bytes, v)) return v;
  warn_malformed(s, t);
  parse_number(s.default_value, true, v);
  return v;
}

std::string setting_string(const setting& s) {
  return setting_text(s);
}

void register_settings(std::span<const setting> table) {
  std::lock_guard lock(registry_mutex());
  registry().insert(registry().end(), table.begin(), table.end());
}

std::vector<setting> list_settings() {
  std::lock_guard lock(registry_mutex());
  return registry();
}

}  // namespace vmmc::core
