// vmmc/core/host.h: what "this host" means, the one definition every layer
// uses.
//
// Two processes are on one host when they run on one kernel (the same boot
// id) in one network namespace. Only then can they reach each other's
// abstract Unix sockets (core's control links, NX's doorbells), hand each
// other memfds, and so take the mapped path. Processes on one kernel in
// different network namespaces (containers, our simulated hosts) are on
// different hosts that still share CPUs. Host names decide nothing: they
// repeat across containers and namespaces.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <optional>
#include <string>
#include <string_view>

namespace vmmc::core {

struct host_identity {
  std::string kernel;   // the boot id, dashes removed
  std::string network;  // the network namespace's inode number, in decimal

  // This process's, read now (a process may move to another namespace).
  static host_identity local();
  // "<kernel>.<network>": printable, no spaces; what addresses carry.
  std::string text() const;
  // The inverse of text(); nullopt for anything text() cannot produce.
  static std::optional<host_identity> parse(std::string_view text);

  // One kernel and one network namespace.
  bool same_host(const host_identity& o) const {
    return kernel == o.kernel && network == o.network;
  }
  // One kernel: the two share its CPUs, whatever their namespaces.
  bool same_kernel(const host_identity& o) const { return kernel == o.kernel; }
};

// The IPv4 address by which other hosts most likely reach this one: that of
// the interface with the default route, else of the first other interface
// that is up (not loopback), else 127.0.0.1. For a process whose peers on
// other hosts are known but no connection to them (NX under a launcher).
std::string address_other_hosts_reach();

// Whether peers on another host keep kernel TCP, by a layer's setting for
// them (VMMC_SOCKETS_REMOTE, VMMC_NX_REMOTE): "fabric" never, "tcp" always,
// anything else ("auto") unless this host has a device a fabric provider can
// offload to (verbs, efa and usnic under /sys/class/infiniband, HPE
// Slingshot's cxi, Omni-Path's hfi1). Without one, a provider to another
// host (tcp) is kernel TCP plus its own framing and progress: it can only
// lose to the kernel TCP it would replace. One rule for every layer.
bool kernel_tcp_to_other_hosts(std::string_view mode);

}  // namespace vmmc::core

#pragma GCC visibility pop
