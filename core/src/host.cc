// host_identity (vmmc/core/host.h): the boot id and the network namespace.
#include "vmmc/core/host.h"

#include <sys/stat.h>

#include <fstream>

namespace vmmc::core {

namespace {
bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
}  // namespace

host_identity host_identity::local() {
  host_identity id;
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  for (char c : boot)
    if (is_hex(c)) id.kernel += c;
  struct stat st {};
  id.network = std::to_string(::stat("/proc/self/ns/net", &st) == 0 ? st.st_ino : 0);
  return id;
}

std::string host_identity::text() const {
  return kernel + "." + network;
}

std::optional<host_identity> host_identity::parse(std::string_view text) {
  auto dot = text.find('.');
  // An empty kernel part is what text() makes where the boot id cannot be read.
  if (dot == std::string_view::npos || dot + 1 == text.size() || dot > 64 ||
      text.size() - dot - 1 > 20)
    return std::nullopt;
  host_identity id{std::string(text.substr(0, dot)), std::string(text.substr(dot + 1))};
  for (char c : id.kernel)
    if (!is_hex(c)) return std::nullopt;
  for (char c : id.network)
    if (!is_digit(c)) return std::nullopt;
  return id;
}

}  // namespace vmmc::core
