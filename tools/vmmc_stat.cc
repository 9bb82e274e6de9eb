// vmmc-stat [--json] [--pid PID] [--dir DIR] [--wait MS]: the live view of
// every connection of every process on this host that runs the vmmc sockets
// layer (the role of smcss or onload_stackdump): its process, addresses,
// path (mapped, fabric:<provider>, tcp), why it stayed on kernel TCP, bytes
// each way, received bytes redirected vs copied, and each process's UTLB
// counters. It reads what the processes publish (vmmc/sockets/stat.h) and,
// for connections on kernel TCP, the kernel's byte counts (sock_diag, as
// `ss -ti` does). It stops nothing and needs no privilege for the user's own
// processes; root sees every user's.
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "vmmc/sockets/stat.h"

namespace {
using vmmc::sockets::fallback;
using vmmc::sockets::published_connection;
using vmmc::sockets::published_process;

struct kernel_counts {
  std::uint64_t bytes_in = 0, bytes_out = 0;
};

// Every TCP socket's byte counts by inode, from the kernel (NETLINK_SOCK_DIAG).
std::map<std::uint64_t, kernel_counts> kernel_tcp_counts() {
  std::map<std::uint64_t, kernel_counts> counts;
  int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return counts;
  for (int family : {AF_INET, AF_INET6}) {
    struct {
      nlmsghdr header;
      inet_diag_req_v2 request;
    } message{};
    message.header.nlmsg_len = sizeof message;
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.request.sdiag_family = static_cast<std::uint8_t>(family);
    message.request.sdiag_protocol = IPPROTO_TCP;
    message.request.idiag_states = ~0U;
    message.request.idiag_ext = 1 << (INET_DIAG_INFO - 1);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd, &message, sizeof message, 0, reinterpret_cast<sockaddr*>(&kernel),
                 sizeof kernel) < 0)
      break;
    alignas(nlmsghdr) static char buffer[1 << 16];
    auto align = [](std::size_t n) { return (n + 3) & ~std::size_t{3}; };
    for (bool done = false; !done;) {
      ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      std::size_t at = 0, end = static_cast<std::size_t>(n);
      while (!done && at + sizeof(nlmsghdr) <= end) {
        nlmsghdr h;
        std::memcpy(&h, buffer + at, sizeof h);
        if (h.nlmsg_len < sizeof h || at + h.nlmsg_len > end) break;
        if (h.nlmsg_type == NLMSG_DONE || h.nlmsg_type == NLMSG_ERROR) {
          done = true;
          break;
        }
        std::size_t body = at + align(sizeof h), stop = at + h.nlmsg_len;
        if (body + sizeof(inet_diag_msg) <= stop) {
          inet_diag_msg diag;
          std::memcpy(&diag, buffer + body, sizeof diag);
          // Attributes after the message: rtattr {length, type}, then data.
          for (std::size_t a = body + align(sizeof diag); a + 4 <= stop;) {
            std::uint16_t length, type;
            std::memcpy(&length, buffer + a, 2);
            std::memcpy(&type, buffer + a + 2, 2);
            if (length < 4 || a + length > stop) break;
            if (type == INET_DIAG_INFO) {
              tcp_info info{};
              std::size_t got = std::min<std::size_t>(length - 4u, sizeof info);
              std::memcpy(&info, buffer + a + 4, got);
              // Data bytes sent once each (Linux 4.19+); before that, those
              // acknowledged, which on the connecting side count its SYN too.
              std::uint64_t out =
                  got >= offsetof(tcp_info, tcpi_bytes_retrans) + sizeof info.tcpi_bytes_retrans
                      ? info.tcpi_bytes_sent - info.tcpi_bytes_retrans
                      : info.tcpi_bytes_acked;
              counts[diag.idiag_inode] = {info.tcpi_bytes_received, out};
            }
            a += align(length);
          }
        }
        at += align(h.nlmsg_len);
      }
    }
  }
  ::close(fd);
  return counts;
}

// What is shown for a connection: its counters, or the kernel's for one on
// kernel TCP (less our own protocol bytes).
struct shown {
  std::uint64_t bytes_in, bytes_out;
  const char* counted_by;  // "vmmc" or "kernel"
};
shown bytes_of(const published_connection& c,
               const std::map<std::uint64_t, kernel_counts>& kernel) {
  bool ours = c.state == "accelerated" || c.state == "upgrading" || c.why == fallback::reverted;
  auto k = kernel.find(c.inode);
  if (ours || k == kernel.end())
    return {c.tcp_bytes_in + c.vmmc_bytes_in, c.tcp_bytes_out + c.vmmc_bytes_out, "vmmc"};
  auto less = [](std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; };
  return {less(k->second.bytes_in, c.protocol_bytes_in),
          less(k->second.bytes_out, c.protocol_bytes_out), "kernel"};
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch >= 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", ch);
      out += escaped;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

void print_json(const std::vector<published_process>& all,
                const std::map<std::uint64_t, kernel_counts>& kernel) {
  std::printf("{\"processes\": [");
  const char* comma = "";
  for (const auto& p : all) {
    std::printf(
        "%s\n  {\"pid\": %d, \"uid\": %u, \"command\": %s, \"live\": %s, \"has_context\": %s,\n"
        "   \"utlb\": {\"lookups\": %llu, \"hits\": %llu, \"misses\": %llu, \"registrations\": "
        "%llu, \"evictions\": %llu, \"bytes_registered\": %llu},\n"
        "   \"not_shown\": %u, \"connections\": [",
        comma, static_cast<int>(p.pid), static_cast<unsigned>(p.uid),
        json_string(p.command).c_str(), p.live ? "true" : "false", p.has_context ? "true" : "false",
        static_cast<unsigned long long>(p.utlb_lookups),
        static_cast<unsigned long long>(p.utlb_hits),
        static_cast<unsigned long long>(p.utlb_misses),
        static_cast<unsigned long long>(p.utlb_registrations),
        static_cast<unsigned long long>(p.utlb_evictions),
        static_cast<unsigned long long>(p.utlb_bytes_registered), p.not_shown);
    comma = ",";
    const char* inner = "";
    for (const auto& c : p.connections) {
      shown b = bytes_of(c, kernel);
      bool fell_back = c.why != fallback::none;
      std::printf(
          "%s\n    {\"fd\": %d, \"role\": \"%s\", \"local\": %s, \"remote\": %s, \"state\": "
          "\"%s\", "
          "\"path\": %s, \"fallback\": %s, \"reason\": %s, \"bytes_in\": %llu, \"bytes_out\": "
          "%llu, "
          "\"counted_by\": \"%s\", \"tcp_bytes_in\": %llu, \"tcp_bytes_out\": %llu, "
          "\"vmmc_bytes_in\": %llu, \"vmmc_bytes_out\": %llu, \"bytes_copied\": %llu, "
          "\"bytes_redirected\": %llu}",
          inner, c.fd, c.is_client ? "client" : "server", json_string(c.local).c_str(),
          json_string(c.remote).c_str(), c.state.c_str(), json_string(c.path).c_str(),
          fell_back ? json_string(std::string(vmmc::sockets::fallback_name(c.why))).c_str()
                    : "null",
          fell_back ? json_string(std::string(vmmc::sockets::fallback_text(c.why))).c_str()
                    : "null",
          static_cast<unsigned long long>(b.bytes_in), static_cast<unsigned long long>(b.bytes_out),
          b.counted_by, static_cast<unsigned long long>(c.tcp_bytes_in),
          static_cast<unsigned long long>(c.tcp_bytes_out),
          static_cast<unsigned long long>(c.vmmc_bytes_in),
          static_cast<unsigned long long>(c.vmmc_bytes_out),
          static_cast<unsigned long long>(c.bytes_copied),
          static_cast<unsigned long long>(c.bytes_redirected));
      inner = ",";
    }
    std::printf("%s]}", p.connections.empty() ? "" : "\n  ");
  }
  std::printf("%s]}\n", all.empty() ? "" : "\n");
}

std::string human_bytes(std::uint64_t n) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return text;
}

void print_table(const std::vector<published_process>& all,
                 const std::map<std::uint64_t, kernel_counts>& kernel) {
  std::size_t connections = 0, accelerated = 0;
  for (const auto& p : all)
    for (const auto& c : p.connections) {
      ++connections;
      accelerated += c.state == "accelerated";
    }
  std::printf("%zu process%s, %zu connection%s: %zu accelerated, %zu not\n", all.size(),
              all.size() == 1 ? "" : "es", connections, connections == 1 ? "" : "s", accelerated,
              connections - accelerated);
  for (const auto& p : all) {
    std::printf("\npid %d uid %u: %s\n", static_cast<int>(p.pid), static_cast<unsigned>(p.uid),
                p.command.c_str());
    if (p.has_context)
      std::printf(
          "  UTLB: %llu lookups, %llu hits, %llu misses, %llu registrations, %llu "
          "evictions, %s registered%s\n",
          static_cast<unsigned long long>(p.utlb_lookups),
          static_cast<unsigned long long>(p.utlb_hits),
          static_cast<unsigned long long>(p.utlb_misses),
          static_cast<unsigned long long>(p.utlb_registrations),
          static_cast<unsigned long long>(p.utlb_evictions),
          human_bytes(p.utlb_bytes_registered).c_str(),
          p.live ? "" : " (did not answer: as last published)");
    else
      std::printf("  no VMMC context (met no vmmc peer): kernel TCP only\n");
    if (p.not_shown)
      std::printf("  %u connection%s on descriptors beyond the published rows not shown\n",
                  p.not_shown, p.not_shown == 1 ? "" : "s");
    if (p.connections.empty()) continue;
    std::printf("  %4s %-6s %-22s %-22s %-11s %-10s %10s %10s %10s %10s  %s\n", "FD", "ROLE",
                "LOCAL", "REMOTE", "STATE", "PATH", "BYTES-IN", "BYTES-OUT", "REDIRECTED", "COPIED",
                "WHY");
    for (const auto& c : p.connections) {
      shown b = bytes_of(c, kernel);
      bool vmmc = c.vmmc_bytes_in || c.vmmc_bytes_out || c.state == "accelerated";
      std::printf("  %4d %-6s %-22s %-22s %-11s %-10s %10llu %10llu %10s %10s  %s\n", c.fd,
                  c.is_client ? "client" : "server", c.local.c_str(), c.remote.c_str(),
                  c.state.c_str(), c.path.c_str(), static_cast<unsigned long long>(b.bytes_in),
                  static_cast<unsigned long long>(b.bytes_out),
                  vmmc ? std::to_string(c.bytes_redirected).c_str() : "-",
                  vmmc ? std::to_string(c.bytes_copied).c_str() : "-",
                  std::string(vmmc::sockets::fallback_text(c.why)).c_str());
    }
  }
}

void usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: vmmc-stat [--json] [--pid PID] [--dir DIR] [--wait MS]\n"
      "Lists the connections of every process on this host that runs vmmc sockets\n"
      "(under vmmc-run, or linked with the layer): accelerated or not, and why.\n"
      "  --json      one JSON document, for scripts\n"
      "  --pid PID   only that process\n"
      "  --dir DIR   where processes publish (default: VMMC_SOCKETS_STAT_DIR or /dev/shm)\n"
      "  --wait MS   how long to wait for each process's fresh counters (default 300)\n"
      "  -h, --help  this text\n");
}
}  // namespace

int main(int argc, char** argv) {
  vmmc::sockets::read_options options;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--json") {
      json = true;
    } else if (a == "--pid" && has_value) {
      options.only_pid = static_cast<pid_t>(std::atoi(argv[++i]));
    } else if (a == "--dir" && has_value) {
      options.directory = argv[++i];
    } else if (a == "--wait" && has_value) {
      options.wait = std::chrono::milliseconds(std::atoi(argv[++i]));
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "vmmc-stat: bad argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  auto all = vmmc::sockets::read_published(options);
  auto kernel = kernel_tcp_counts();
  if (json)
    print_json(all, kernel);
  else
    print_table(all, kernel);
  return 0;
}
