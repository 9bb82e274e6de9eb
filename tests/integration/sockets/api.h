// The socket api a test runs over: `kernel_api` (libc, the oracle) or
// `vmmc_api` (vmmc::sockets). Every sockets integration test is written once
// against `api` and instantiated for both, so the kernel shows what the right
// answer is. The checks that only make sense for vmmc (is this connection
// accelerated? did it fall back?) live here and pass trivially for the kernel.
#pragma once

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "vmmc/sockets/socket.h"

namespace vmmc::test {

namespace vs = vmmc::sockets;

struct api {
  const char* name;
  bool vmmc;  // calls go to vmmc::sockets, so describe() should know its descriptors
  decltype(&vs::socket) socket;
  decltype(&vs::bind) bind;
  decltype(&vs::listen) listen;
  decltype(&vs::accept) accept;
  decltype(&vs::accept4) accept4;
  decltype(&vs::connect) connect;
  decltype(&vs::read) read;
  decltype(&vs::write) write;
  decltype(&vs::readv) readv;
  decltype(&vs::writev) writev;
  decltype(&vs::recv) recv;
  decltype(&vs::send) send;
  decltype(&vs::recvmsg) recvmsg;
  decltype(&vs::sendmsg) sendmsg;
  decltype(&vs::shutdown) shutdown;
  decltype(&vs::close) close;
  decltype(&vs::dup) dup;
  decltype(&vs::dup2) dup2;
  decltype(&vs::getsockopt) getsockopt;
  decltype(&vs::setsockopt) setsockopt;
  decltype(&vs::getsockname) getsockname;
  decltype(&vs::getpeername) getpeername;
  decltype(&vs::fcntl) fcntl;
  decltype(&vs::ioctl) ioctl;
  decltype(&vs::poll) poll;
  decltype(&vs::select) select;
  decltype(&vs::epoll_create1) epoll_create1;
  decltype(&vs::epoll_ctl) epoll_ctl;
  decltype(&vs::epoll_wait) epoll_wait;
};

inline const api kernel_api{
    .name = "kernel",
    .vmmc = false,
    .socket = ::socket,
    .bind = ::bind,
    .listen = ::listen,
    .accept = ::accept,
    .accept4 = ::accept4,
    .connect = ::connect,
    .read = ::read,
    .write = ::write,
    .readv = ::readv,
    .writev = ::writev,
    .recv = ::recv,
    .send = ::send,
    .recvmsg = ::recvmsg,
    .sendmsg = ::sendmsg,
    .shutdown = ::shutdown,
    .close = ::close,
    .dup = ::dup,
    .dup2 = ::dup2,
    .getsockopt = ::getsockopt,
    .setsockopt = ::setsockopt,
    .getsockname = ::getsockname,
    .getpeername = ::getpeername,
    .fcntl = [](int fd, int command, long argument) { return ::fcntl(fd, command, argument); },
    .ioctl = [](int fd, unsigned long request,
                void* argument) { return ::ioctl(fd, request, argument); },
    .poll = ::poll,
    .select = ::select,
    .epoll_create1 = ::epoll_create1,
    .epoll_ctl = ::epoll_ctl,
    .epoll_wait = ::epoll_wait,
};

inline const api vmmc_api{
    .name = "vmmc",
    .vmmc = true,
    .socket = vs::socket,
    .bind = vs::bind,
    .listen = vs::listen,
    .accept = vs::accept,
    .accept4 = vs::accept4,
    .connect = vs::connect,
    .read = vs::read,
    .write = vs::write,
    .readv = vs::readv,
    .writev = vs::writev,
    .recv = vs::recv,
    .send = vs::send,
    .recvmsg = vs::recvmsg,
    .sendmsg = vs::sendmsg,
    .shutdown = vs::shutdown,
    .close = vs::close,
    .dup = vs::dup,
    .dup2 = vs::dup2,
    .getsockopt = vs::getsockopt,
    .setsockopt = vs::setsockopt,
    .getsockname = vs::getsockname,
    .getpeername = vs::getpeername,
    .fcntl = vs::fcntl,
    .ioctl = vs::ioctl,
    .poll = vs::poll,
    .select = vs::select,
    .epoll_create1 = vs::epoll_create1,
    .epoll_ctl = vs::epoll_ctl,
    .epoll_wait = vs::epoll_wait,
};

inline const api& api_named(std::string_view name) {
  return name == vmmc_api.name ? vmmc_api : kernel_api;
}

// So GoogleTest names the parameter instead of printing its address.
inline void PrintTo(const api* a, std::ostream* out) {
  *out << a->name;
}

// ---- Expectations that only vmmc has. Each returns "" when satisfied (always
// for kernel_api) or what was wrong, so a forked peer can report it too.

inline std::string describe_text(const std::optional<vs::socket_info>& info) {
  if (!info) return "describe() = nullopt";
  return "accelerated=" + std::to_string(info->accelerated) +
         " plain=" + std::to_string(info->plain) +
         (info->why.empty() ? "" : " (" + info->why + ")") + " path=" + info->path +
         " tcp_in=" + std::to_string(info->tcp_bytes_in) +
         " tcp_out=" + std::to_string(info->tcp_bytes_out) +
         " in=" + std::to_string(info->bytes_in) + " out=" + std::to_string(info->bytes_out) +
         " copied=" + std::to_string(info->bytes_copied) +
         " redirected=" + std::to_string(info->bytes_redirected);
}

// A vmmc-to-vmmc connection on this host, after data went both ways: both
// directions run over VMMC.
inline std::string check_accelerated(const api& a, int fd) {
  if (!a.vmmc) return "";
  auto info = vs::describe(fd);
  if (info && info->accelerated && !info->plain && info->path != "tcp") return "";
  return "expected an accelerated connection, got " + describe_text(info);
}

// A vmmc end talking to a plain kernel TCP peer, after it has read from the
// peer (data or EOF): it has decided the peer is plain and stays on TCP.
inline std::string check_plain(const api& a, int fd) {
  if (!a.vmmc) return "";
  auto info = vs::describe(fd);
  if (info && info->plain && !info->accelerated && info->path == "tcp" && info->bytes_in == 0 &&
      info->bytes_out == 0)
    return "";
  return "expected a plain (fallen back) connection, got " + describe_text(info);
}

// A vmmc end whose peer is vmmc too, after it read from the peer: whatever
// the path, the peer must never be taken for a plain TCP program.
inline std::string check_not_plain(const api& a, int fd) {
  if (!a.vmmc) return "";
  auto info = vs::describe(fd);
  if (info && !info->plain) return "";
  return "expected a vmmc peer to be recognised, got " + describe_text(info);
}

// Byte accounting on a vmmc descriptor: every application byte went either
// over TCP or over VMMC, and every VMMC byte received was placed exactly once
// (copied out of the default buffer or redirected).
inline std::string check_counters(const api& a, int fd, std::uint64_t bytes_read,
                                  std::uint64_t bytes_written) {
  if (!a.vmmc) return "";
  auto info = vs::describe(fd);
  if (info && info->tcp_bytes_in + info->bytes_in == bytes_read &&
      info->tcp_bytes_out + info->bytes_out == bytes_written &&
      info->bytes_copied + info->bytes_redirected == info->bytes_in)
    return "";
  return "expected counters to add up to " + std::to_string(bytes_read) + " read and " +
         std::to_string(bytes_written) + " written, got " + describe_text(info);
}

// Descriptors made with kernel calls are none of the library's business.
inline std::string check_unmanaged(int fd) {
  auto info = vs::describe(fd);
  return info ? "expected describe() = nullopt for a kernel socket, got " + describe_text(info)
              : "";
}

}  // namespace vmmc::test
