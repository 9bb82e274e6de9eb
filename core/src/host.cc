// host_identity (vmmc/core/host.h): the boot id and the network namespace.
#include "vmmc/core/host.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace vmmc::core {

namespace {
// An IPv4 address of `interface` (any interface if empty) that is up and
// not loopback; empty if none.
std::string interface_address(const std::string& interface) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        (i->ifa_flags & IFF_LOOPBACK) || (!interface.empty() && interface != i->ifa_name))
      continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// The interface of the IPv4 default route (/proc/net/route), if any.
std::string default_route_interface() {
  std::ifstream routes("/proc/net/route");
  std::string line, name, destination;
  std::getline(routes, line);  // header
  while (routes >> name >> destination && std::getline(routes, line))
    if (destination == "00000000") return name;
  return {};
}

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

std::string address_other_hosts_reach() {
  if (std::string a = interface_address(default_route_interface()); !a.empty()) return a;
  if (std::string a = interface_address({}); !a.empty()) return a;
  return "127.0.0.1";
}

namespace {
bool rdma_device_present() {
  static const bool present = [] {
    if (DIR* d = ::opendir("/sys/class/infiniband")) {
      bool any = false;
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') any = true;
      ::closedir(d);
      if (any) return true;
    }
    return ::access("/dev/cxi0", F_OK) == 0 || ::access("/dev/hfi1_0", F_OK) == 0;
  }();
  return present;
}
}  // namespace

bool kernel_tcp_to_other_hosts(std::string_view mode) {
  if (mode == "fabric") return false;
  return mode == "tcp" || !rdma_device_present();
}

}  // namespace vmmc::core
