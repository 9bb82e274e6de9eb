// vmmc/sockets/socket.h: BSD stream sockets over VMMC, with Linux semantics.
//
// Every function has the signature and the POSIX contract of the libc call of
// the same name: it returns -1 and sets errno on failure, and the descriptor
// the caller holds is always a real kernel descriptor. Descriptors that are
// not TCP sockets (files, pipes, UDP, Unix sockets) are passed straight to the
// kernel, so a program (or the preload module) may route every call here.
//
// How a TCP connection is accelerated (see sockets/README.md for the wire
// protocol): it starts as an ordinary kernel connection. Each end announces
// itself with one TCP urgent byte before any data of its own; plain TCP
// programs never see urgent bytes, so they are not disturbed, and a vmmc end
// decides from the first byte it receives whether the peer speaks VMMC. When
// both do, they set up redirect channels in-band and switch each direction
// over at a byte offset the receiver learns through the channel. Bytes written
// before the switch travel over TCP; nothing is lost, doubled or reordered.
// Otherwise the connection simply stays kernel TCP.
//
// Readiness: poll/select/epoll on an accelerated descriptor must go through
// the functions below (the preload module routes them here). A reader that
// sleeps is woken through its kernel descriptor (the peer sends a doorbell
// byte over TCP); a reader that finds data pays no system call.
//
// Thread safety: as for kernel sockets, one thread may read while another
// writes the same socket, and accept() may run concurrently with I/O on other
// sockets. Closing a descriptor while another thread uses it is undefined,
// as it is for the kernel.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <optional>
#include <string>

namespace vmmc::sockets {

int socket(int domain, int type, int protocol);
// Makes a TCP socket that another library created (not yet connected,
// possibly bound or with options set) one of ours, as if socket() had made
// it: its connect() then offers VMMC. Returns 0; -1 with EINVAL when `fd`
// is not an unconnected TCP socket, or when acceleration is disabled.
int take_over(int fd);
int bind(int fd, const sockaddr* address, socklen_t length);
int listen(int fd, int backlog);
int accept(int fd, sockaddr* address, socklen_t* length);
int accept4(int fd, sockaddr* address, socklen_t* length, int flags);
int connect(int fd, const sockaddr* address, socklen_t length);

ssize_t read(int fd, void* buffer, size_t length);
ssize_t write(int fd, const void* buffer, size_t length);
ssize_t readv(int fd, const iovec* iov, int count);
ssize_t writev(int fd, const iovec* iov, int count);
ssize_t recv(int fd, void* buffer, size_t length, int flags);
ssize_t send(int fd, const void* buffer, size_t length, int flags);
ssize_t recvfrom(int fd, void* buffer, size_t length, int flags, sockaddr* address,
                 socklen_t* address_length);
ssize_t sendto(int fd, const void* buffer, size_t length, int flags, const sockaddr* address,
               socklen_t address_length);
ssize_t recvmsg(int fd, msghdr* message, int flags);
ssize_t sendmsg(int fd, const msghdr* message, int flags);

int shutdown(int fd, int how);
// Closing one of several descriptors of a socket (dup, or a fork() copy)
// leaves the connection alone; the last one ends it.
int close(int fd);
// close() for every descriptor from `first` to `last` (unless `flags` has
// CLOSE_RANGE_CLOEXEC); closefrom(3) is close_range(first, ~0U, 0).
int close_range(unsigned int first, unsigned int last, int flags);
// The copies name the same stream: either may be used or closed.
int dup(int fd);
int dup2(int fd, int target);
int dup3(int fd, int target, int flags);
ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count);
int recvmmsg(int fd, mmsghdr* messages, unsigned int count, int flags, timespec* timeout);
int sendmmsg(int fd, mmsghdr* messages, unsigned int count, int flags);

int getsockopt(int fd, int level, int name, void* value, socklen_t* length);
int setsockopt(int fd, int level, int name, const void* value, socklen_t length);
int getsockname(int fd, sockaddr* address, socklen_t* length);
int getpeername(int fd, sockaddr* address, socklen_t* length);
// fcntl's third argument as an integer (F_GETFL/F_SETFL/F_GETFD/F_SETFD/
// F_DUPFD...); commands taking a pointer go to the kernel unchanged.
int fcntl(int fd, int command, long argument = 0);
int ioctl(int fd, unsigned long request, void* argument);

int poll(pollfd* fds, nfds_t count, int timeout_ms);
int ppoll(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask);
int select(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional, timeval* timeout);
int pselect(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional,
            const timespec* timeout, const sigset_t* mask);
int epoll_create(int size);
int epoll_create1(int flags);
int epoll_ctl(int epfd, int op, int fd, epoll_event* event);
int epoll_wait(int epfd, epoll_event* events, int max_events, int timeout_ms);
int epoll_pwait(int epfd, epoll_event* events, int max_events, int timeout_ms,
                const sigset_t* mask);

// For a program that sleeps in a kernel poll of its own (libtirpc's svc_run
// under a vRPC server), where an armed peer on this host would otherwise
// wake it with a TCP segment: a new descriptor (an eventfd, close-on-exec,
// the caller's to close) that becomes readable when the peer wakes a sleeper
// of `fd`. From this call on, a read of `fd` that finds nothing arms the
// peer to write it instead. The caller polls it beside `fd` (the end of the
// stream, and peers that cannot write it, still wake `fd`) and reads its 8
// bytes when it found it readable. -1 with errno ENOTCONN when `fd` has no
// such descriptor (not upgraded, or the process was short of descriptors),
// EBADF for a descriptor this library does not manage, EMFILE when the new
// descriptor's number would not be below `limit` (the size of the caller's
// table of descriptors, e.g. _rpc_dtablesize()); nothing changes then.
int wakeup_descriptor(int fd, int limit);

// What this library knows about one descriptor; nullopt for descriptors it
// does not manage. For tests, benchmarks and diagnostics.
struct socket_info {
  bool accelerated;  // both directions run over VMMC
  bool plain;        // decided: the peer is a plain TCP program (or set-up failed)
  std::string why;   // why it is kernel TCP for good, as vmmc-stat says it ("" if it is not)
  std::string path;  // "mapped", "fabric:<provider>", or "tcp"
  std::uint64_t tcp_bytes_in, tcp_bytes_out;     // application bytes that went over TCP
  std::uint64_t bytes_in, bytes_out;             // application bytes over VMMC
  std::uint64_t bytes_copied, bytes_redirected;  // how received VMMC bytes were placed
  std::uint64_t doorbells_in, doorbells_out;
};
std::optional<socket_info> describe(int fd);
// describe() as one line of text into `out` (snprintf's contract); -1 for a
// descriptor this library does not manage.
int describe_line(int fd, char* out, size_t length);

// --- For the LD_PRELOAD interposer (preload/).
//
// fork() and exec(): see sockets/README.md for the exact behaviour. In short,
// before fork() (a pthread_atfork handler) every accelerated connection goes
// back to kernel TCP, in both directions, at byte offsets both ends agree on
// (wire.h's revert records); bytes already taken off it are kept in memory
// the child shares, and are read first by whichever process reads next.
// New connections in either process are accelerated again (the child makes
// its own VMMC context). Before exec() the same happens to every connection
// the new image inherits (no FD_CLOEXEC), and bytes taken off it travel in a
// memfd named in the environment (VMMC_SOCKETS_INHERIT), which the new
// image's interposer_install() picks up.

// The calling thread's flag, true while it is inside one of this library's
// calls: the calls the library makes meanwhile must go to libc, even when
// the program called the library directly (a program linked with it, run
// under the interposer). The address stays valid for the thread's life.
const bool* inside_flag() noexcept;

// VMMC_PRELOAD_ENABLE: whether the interposer routes calls here at all.
bool interposer_enabled();
// Once per process, before the interposer routes calls here: fork handlers,
// and connections handed over by the image that exec()ed this one.
void interposer_install();
// Before exec(): takes inherited connections back to TCP; returns the
// environment to pass (`envp`, or a copy with VMMC_SOCKETS_INHERIT).
char* const* prepare_exec(char* const* envp);
// SOCK_CLOEXEC (the same bit as O_CLOEXEC and EPOLL_CLOEXEC) while this
// thread opens descriptors for the stack (core::opening_for_the_stack()),
// else 0: the interposers add it to the descriptor-creating calls they pass
// to libc, so that no child of the program inherits libfabric's.
int stack_cloexec() noexcept;

}  // namespace vmmc::sockets

#pragma GCC visibility pop
