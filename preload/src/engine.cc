// preload/src/engine.cc: the interposer's engine, loaded by the interposer
// (preload.cc) once the process meets a TCP socket. It only forwards.
//
// Each wrapped libc call goes to vmmc::sockets, which decides what to do
// (descriptors that are not TCP sockets go straight to the kernel there).
// The calls it passes on are the interposer's (libc's, or the next
// interposer's, as RTLD_NEXT found them). While a thread is inside the
// sockets layer (or the layers below it, or libfabric) a thread-local flag
// sends every call it makes straight on, so the library never recurses
// through itself. Threads of the library's own (the core's control thread,
// the memory monitor) call in from outside: their descriptors are not
// managed, so sockets passes them to the kernel.
//
// Modelled on rdma-core's librdmacm/preload.c. Exported symbol: exactly
// vmmc_preload_engine (engine.map).
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include "calls.h"
#include "vmmc/sockets/socket.h"

namespace so = vmmc::sockets;
static_assert(int{SOCK_CLOEXEC} == int{EPOLL_CLOEXEC} && int{SOCK_CLOEXEC} == int{O_CLOEXEC});

namespace {

// The calls we pass on: the interposer's (libc's).
vmmc_preload_calls real{};

// This thread is in the library: pass the call on. Initial-exec: a flag of
// a few bytes in the static TLS a dlopen()ed module may use, one load.
thread_local bool inside __attribute__((tls_model("initial-exec"))) = false;
bool active = false;  // VMMC_PRELOAD_ENABLE

struct scope {
  scope() { inside = true; }
  ~scope() { inside = false; }
};

void install() {
  scope s;
  active = so::interposer_enabled();
  so::interposer_install();
  // The sockets layer's fork handlers (registered just now) run inside this
  // guard: prepare handlers run in reverse order of registration, the others
  // in order. Also covers forks inside libc (daemon()).
  ::pthread_atfork([] { inside = true; }, [] { inside = false; }, [] { inside = false; });
}

// The sockets layer's own flag for this thread: set while the program
// calls the layer directly (it links it) as well as through us.
thread_local const bool* sockets_inside __attribute__((tls_model("initial-exec"))) = nullptr;

inline bool bypass() {
  if (inside || !active) return true;
  if (__builtin_expect(sockets_inside == nullptr, 0)) sockets_inside = so::inside_flag();
  return *sockets_inside;
}

}  // namespace

// Each wrapper: libc when inside the library (or turned off), else sockets.
#define FORWARD(real_call, ours)       \
  if (bypass()) return real.real_call; \
  scope guard;                         \
  return so::ours;

// Named as the calls they wrap; collected in the table at the end.
namespace wrap {

// What libfabric opens for the stack (it calls these from inside) is
// close-on-exec: so::stack_cloexec().
int socket(int domain, int type, int protocol) {
  FORWARD(socket(domain, type | so::stack_cloexec(), protocol), socket(domain, type, protocol));
}
int socketpair(int domain, int type, int protocol, int fds[2]) {
  return real.socketpair(domain, type | so::stack_cloexec(), protocol, fds);
}
int bind(int fd, const sockaddr* address, socklen_t length) {
  FORWARD(bind(fd, address, length), bind(fd, address, length));
}
int listen(int fd, int backlog) {
  FORWARD(listen(fd, backlog), listen(fd, backlog));
}
int accept(int fd, sockaddr* address, socklen_t* length) {
  FORWARD(accept4(fd, address, length, so::stack_cloexec()), accept(fd, address, length));
}
int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  FORWARD(accept4(fd, address, length, flags | so::stack_cloexec()),
          accept4(fd, address, length, flags));
}
int connect(int fd, const sockaddr* address, socklen_t length) {
  FORWARD(connect(fd, address, length), connect(fd, address, length));
}

ssize_t read(int fd, void* buffer, size_t length) {
  FORWARD(read(fd, buffer, length), read(fd, buffer, length));
}
ssize_t __read_chk(int fd, void* buffer, size_t length, size_t buffer_length) {
  if (length > buffer_length) return real.__read_chk(fd, buffer, length, buffer_length);
  FORWARD(read(fd, buffer, length), read(fd, buffer, length));
}
ssize_t write(int fd, const void* buffer, size_t length) {
  FORWARD(write(fd, buffer, length), write(fd, buffer, length));
}
ssize_t readv(int fd, const iovec* iov, int count) {
  FORWARD(readv(fd, iov, count), readv(fd, iov, count));
}
ssize_t writev(int fd, const iovec* iov, int count) {
  FORWARD(writev(fd, iov, count), writev(fd, iov, count));
}
ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  FORWARD(recv(fd, buffer, length, flags), recv(fd, buffer, length, flags));
}
ssize_t __recv_chk(int fd, void* buffer, size_t length, size_t buffer_length, int flags) {
  if (length > buffer_length) return real.__recv_chk(fd, buffer, length, buffer_length, flags);
  FORWARD(recv(fd, buffer, length, flags), recv(fd, buffer, length, flags));
}
ssize_t send(int fd, const void* buffer, size_t length, int flags) {
  FORWARD(send(fd, buffer, length, flags), send(fd, buffer, length, flags));
}
ssize_t recvfrom(int fd, void* buffer, size_t length, int flags, sockaddr* address,
                 socklen_t* address_length) {
  FORWARD(recvfrom(fd, buffer, length, flags, address, address_length),
          recvfrom(fd, buffer, length, flags, address, address_length));
}
ssize_t __recvfrom_chk(int fd, void* buffer, size_t length, size_t buffer_length, int flags,
                       sockaddr* address, socklen_t* address_length) {
  if (length > buffer_length)
    return real.__recvfrom_chk(fd, buffer, length, buffer_length, flags, address, address_length);
  FORWARD(recvfrom(fd, buffer, length, flags, address, address_length),
          recvfrom(fd, buffer, length, flags, address, address_length));
}
ssize_t sendto(int fd, const void* buffer, size_t length, int flags, const sockaddr* address,
               socklen_t address_length) {
  FORWARD(sendto(fd, buffer, length, flags, address, address_length),
          sendto(fd, buffer, length, flags, address, address_length));
}
ssize_t recvmsg(int fd, msghdr* message, int flags) {
  FORWARD(recvmsg(fd, message, flags), recvmsg(fd, message, flags));
}
ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  FORWARD(sendmsg(fd, message, flags), sendmsg(fd, message, flags));
}
int recvmmsg(int fd, mmsghdr* messages, unsigned int count, int flags, timespec* timeout) {
  FORWARD(recvmmsg(fd, messages, count, flags, timeout),
          recvmmsg(fd, messages, count, flags, timeout));
}
int sendmmsg(int fd, mmsghdr* messages, unsigned int count, int flags) {
  FORWARD(sendmmsg(fd, messages, count, flags), sendmmsg(fd, messages, count, flags));
}
ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  FORWARD(sendfile(out_fd, in_fd, offset, count), sendfile(out_fd, in_fd, offset, count));
}
ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t count) {
  FORWARD(sendfile64(out_fd, in_fd, offset, count), sendfile(out_fd, in_fd, offset, count));
}

int poll(pollfd* fds, nfds_t count, int timeout_ms) {
  FORWARD(poll(fds, count, timeout_ms), poll(fds, count, timeout_ms));
}
int __poll_chk(pollfd* fds, nfds_t count, int timeout_ms, size_t fds_length) {
  if (fds_length / sizeof(pollfd) < count)
    return real.__poll_chk(fds, count, timeout_ms, fds_length);
  FORWARD(poll(fds, count, timeout_ms), poll(fds, count, timeout_ms));
}
int ppoll(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask) {
  FORWARD(ppoll(fds, count, timeout, mask), ppoll(fds, count, timeout, mask));
}
int __ppoll_chk(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask,
                size_t fds_length) {
  if (fds_length / sizeof(pollfd) < count)
    return real.__ppoll_chk(fds, count, timeout, mask, fds_length);
  FORWARD(ppoll(fds, count, timeout, mask), ppoll(fds, count, timeout, mask));
}
int select(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional, timeval* timeout) {
  FORWARD(select(nfds, readable, writable, exceptional, timeout),
          select(nfds, readable, writable, exceptional, timeout));
}
int pselect(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional,
            const timespec* timeout, const sigset_t* mask) {
  FORWARD(pselect(nfds, readable, writable, exceptional, timeout, mask),
          pselect(nfds, readable, writable, exceptional, timeout, mask));
}
int epoll_create(int size) {
  if (bypass() && so::stack_cloexec()) return real.epoll_create1(EPOLL_CLOEXEC);
  FORWARD(epoll_create(size), epoll_create(size));
}
int epoll_create1(int flags) {
  FORWARD(epoll_create1(flags | so::stack_cloexec()), epoll_create1(flags));
}
int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
  FORWARD(epoll_ctl(epfd, op, fd, event), epoll_ctl(epfd, op, fd, event));
}
int epoll_wait(int epfd, epoll_event* events, int max_events, int timeout_ms) {
  FORWARD(epoll_wait(epfd, events, max_events, timeout_ms),
          epoll_wait(epfd, events, max_events, timeout_ms));
}
int epoll_pwait(int epfd, epoll_event* events, int max_events, int timeout_ms,
                const sigset_t* mask) {
  FORWARD(epoll_pwait(epfd, events, max_events, timeout_ms, mask),
          epoll_pwait(epfd, events, max_events, timeout_ms, mask));
}

int close(int fd) {
  FORWARD(close(fd), close(fd));
}
int shutdown(int fd, int how) {
  FORWARD(shutdown(fd, how), shutdown(fd, how));
}
int close_range(unsigned int first, unsigned int last, int flags) {
  FORWARD(close_range(first, last, flags), close_range(first, last, flags));
}
void closefrom(int lowest) {
  if (bypass()) return real.closefrom(lowest);
  scope guard;
  if (so::close_range(static_cast<unsigned int>(lowest), ~0U, 0) != 0) {
    // As glibc: without close_range, close one by one.
    for (int fd = lowest; fd < ::sysconf(_SC_OPEN_MAX); ++fd) so::close(fd);
  }
}
int dup(int fd) {
  FORWARD(dup(fd), dup(fd));
}
int dup2(int fd, int target) {
  FORWARD(dup2(fd, target), dup2(fd, target));
}
int dup3(int fd, int target, int flags) {
  FORWARD(dup3(fd, target, flags), dup3(fd, target, flags));
}
// The variadic calls with their argument taken (preload.cc).
int fcntl(int fd, int command, long argument) {
  FORWARD(fcntl(fd, command, argument), fcntl(fd, command, argument));
}
int fcntl64(int fd, int command, long argument) {
  FORWARD(fcntl64(fd, command, argument), fcntl(fd, command, argument));
}
int ioctl(int fd, unsigned long request, void* argument) {
  FORWARD(ioctl(fd, request, argument), ioctl(fd, request, argument));
}
int getsockopt(int fd, int level, int name, void* value, socklen_t* length) {
  FORWARD(getsockopt(fd, level, name, value, length), getsockopt(fd, level, name, value, length));
}
int setsockopt(int fd, int level, int name, const void* value, socklen_t length) {
  FORWARD(setsockopt(fd, level, name, value, length), setsockopt(fd, level, name, value, length));
}
int getsockname(int fd, sockaddr* address, socklen_t* length) {
  FORWARD(getsockname(fd, address, length), getsockname(fd, address, length));
}
int getpeername(int fd, sockaddr* address, socklen_t* length) {
  FORWARD(getpeername(fd, address, length), getpeername(fd, address, length));
}

// exec: every accelerated connection the new image could inherit goes back
// to kernel TCP first (see README.md). The execl* forms come here as the
// array forms (preload.cc gathers their arguments).
#define EXEC(real_call, prepared_call) \
  if (bypass()) return real.real_call; \
  scope guard;                         \
  return real.prepared_call;

int execve(const char* path, char* const argv[], char* const envp[]) {
  EXEC(execve(path, argv, envp), execve(path, argv, so::prepare_exec(envp)));
}
int execv(const char* path, char* const argv[]) {
  EXEC(execv(path, argv), execve(path, argv, so::prepare_exec(environ)));
}
int execvp(const char* file, char* const argv[]) {
  EXEC(execvp(file, argv), execvpe(file, argv, so::prepare_exec(environ)));
}
int execvpe(const char* file, char* const argv[], char* const envp[]) {
  EXEC(execvpe(file, argv, envp), execvpe(file, argv, so::prepare_exec(envp)));
}
int fexecve(int fd, char* const argv[], char* const envp[]) {
  EXEC(fexecve(fd, argv, envp), fexecve(fd, argv, so::prepare_exec(envp)));
}

int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* actions,
                const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  EXEC(posix_spawn(pid, path, actions, attributes, argv, envp),
       posix_spawn(pid, path, actions, attributes, argv, so::prepare_exec(envp)));
}
int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* actions,
                 const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  EXEC(posix_spawnp(pid, file, actions, attributes, argv, envp),
       posix_spawnp(pid, file, actions, attributes, argv, so::prepare_exec(envp)));
}

int describe(int fd, char* out, size_t length) {
  scope guard;
  return so::describe_line(fd, out, length);
}

}  // namespace wrap

namespace {
vmmc_preload_calls ours() {
  vmmc_preload_calls c{};
#define VMMC_REAL(ret, name, ...) c.name = wrap::name;
#include "calls.def"
#undef VMMC_REAL
  c.describe = wrap::describe;
  return c;
}
const vmmc_preload_calls table = ours();
}  // namespace

extern "C" const vmmc_preload_calls* vmmc_preload_engine(const vmmc_preload_calls* next) {
  real = *next;
  install();
  return &table;
}
