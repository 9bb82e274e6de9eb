// preload/src/preload.cc: the LD_PRELOAD interposer, as loaded with every
// program. It wraps the calls in calls.def and passes each on to libc (the
// next definition, dlsym(RTLD_NEXT)) until the process meets a TCP socket:
// it makes one (socket), accepts or connects one, or makes an epoll set
// (which may come to hold one, and must be known from its start). Then it
// loads its engine (engine.cc, beside it), which brings the sockets layer,
// and passes every call to the engine from then on. A program that execs
// another with connections handed over (VMMC_SOCKETS_INHERIT) loads it at
// once.
//
// So a process that never meets a TCP socket (a shell, a compiler, /bin/true
// run by a build) loads this module and libc's, no more: no C++ runtime, no
// layer of ours, no thread (issue 14: 0.6 ms -> 1.4 ms per exec with the
// sockets layer and libstdc++ loaded at start; programs that exec a lot).
// Hence no C++ library here: no exceptions, no standard library calls, no
// statics with dynamic initialisation (linked as C, see CMakeLists.txt).
// Exported symbols: exactly the wrapped calls plus vmmc_preload_describe
// (tests), see preload.map.
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include "calls.h"
#include "engine_loader.h"

namespace {

// libc's calls (or the next interposer's), each resolved at its first use
// (those a signal handler may make at start, see start()): a lookup costs
// about a microsecond, paid for the calls a program makes.
vmmc_preload_calls next{};
#define VMMC_REAL(ret, name, ...)                                            \
  inline ret (*next_##name())(__VA_ARGS__) {                                 \
    auto f = __atomic_load_n(&next.name, __ATOMIC_ACQUIRE);                  \
    if (__builtin_expect(f == nullptr, 0)) {                                 \
      f = reinterpret_cast<ret (*)(__VA_ARGS__)>(::dlsym(RTLD_NEXT, #name)); \
      __atomic_store_n(&next.name, f, __ATOMIC_RELEASE);                     \
    }                                                                        \
    return f;                                                                \
  }
#include "calls.def"
#undef VMMC_REAL

void resolve_all() {
#define VMMC_REAL(ret, name, ...) (void)next_##name();
#include "calls.def"
#undef VMMC_REAL
}

// The engine's calls, once loaded (null before, and for good if it failed).
const vmmc_preload_calls* engine = nullptr;
pthread_once_t engine_once = PTHREAD_ONCE_INIT;
// This thread is loading the engine: the calls the loading makes go on.
thread_local bool loading __attribute__((tls_model("initial-exec"))) = false;

inline const vmmc_preload_calls* loaded() {
  return __atomic_load_n(&engine, __ATOMIC_ACQUIRE);
}

void load_engine() {
  resolve_all();  // the engine passes calls on through the whole table
  loading = true;
  using entry_point = const vmmc_preload_calls* (*)(const vmmc_preload_calls*);
  if (auto entry = reinterpret_cast<entry_point>(vmmc::preload::engine_entry(
          reinterpret_cast<void*>(&load_engine), "libvmmc_preload_engine.so", "vmmc_preload_engine",
          "vmmc-preload")))
    __atomic_store_n(&engine, entry(&next), __ATOMIC_RELEASE);
  loading = false;
}

// The process meets a TCP socket: the engine from now on.
void load_engine_roomily() {
  vmmc::preload::on_roomy_stack(load_engine);
}

inline void meet() {
  if (!loaded() && !loading) ::pthread_once(&engine_once, load_engine_roomily);
}

template <class... Lookup>
void resolve_now(Lookup... lookup) {
  ((void)lookup(), ...);
}

__attribute__((constructor)) void start() {
  // The calls POSIX lets a signal handler make are resolved now: dlsym is
  // not async-signal-safe (a handler's write() to a self-pipe may be the
  // program's first). The others wait for their first use.
  resolve_now(next_accept, next_bind, next_close, next_connect, next_dup, next_dup2, next_execve,
              next_fexecve, next_fcntl, next_getpeername, next_getsockname, next_getsockopt,
              next_listen, next_poll, next_ppoll, next_pselect, next_read, next_recv, next_recvfrom,
              next_recvmsg, next_select, next_send, next_sendmsg, next_sendto, next_setsockopt,
              next_shutdown, next_socket, next_socketpair, next_write);
  if (::getenv("VMMC_SOCKETS_INHERIT")) meet();
}

bool is_stream(int domain, int type) {
  return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM;
}

}  // namespace

// Each wrapper: the engine's call once it is there, else libc's.
#define PASS(name, ...)                                                    \
  if (const vmmc_preload_calls* e = loaded()) return e->name(__VA_ARGS__); \
  return next_##name()(__VA_ARGS__);

extern "C" {

int socket(int domain, int type, int protocol) {
  if (is_stream(domain, type)) meet();
  PASS(socket, domain, type, protocol);
}
int socketpair(int domain, int type, int protocol, int fds[2]) {
  PASS(socketpair, domain, type, protocol, fds);
}
int bind(int fd, const sockaddr* address, socklen_t length) {
  PASS(bind, fd, address, length);
}
int listen(int fd, int backlog) {
  PASS(listen, fd, backlog);
}
// A listener or connection made before us (inherited: inetd, systemd).
int accept(int fd, sockaddr* address, socklen_t* length) {
  meet();
  PASS(accept, fd, address, length);
}
int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  meet();
  PASS(accept4, fd, address, length, flags);
}
int connect(int fd, const sockaddr* address, socklen_t length) {
  if (!loaded() && address && length >= sizeof(sa_family_t) &&
      (address->sa_family == AF_INET || address->sa_family == AF_INET6)) {
    int type = 0;
    socklen_t size = sizeof type;
    if (next_getsockopt()(fd, SOL_SOCKET, SO_TYPE, &type, &size) == 0 && type == SOCK_STREAM)
      meet();
  }
  PASS(connect, fd, address, length);
}

ssize_t read(int fd, void* buffer, size_t length) {
  PASS(read, fd, buffer, length);
}
ssize_t __read_chk(int fd, void* buffer, size_t length, size_t buffer_length) {
  PASS(__read_chk, fd, buffer, length, buffer_length);
}
ssize_t write(int fd, const void* buffer, size_t length) {
  PASS(write, fd, buffer, length);
}
ssize_t readv(int fd, const iovec* iov, int count) {
  PASS(readv, fd, iov, count);
}
ssize_t writev(int fd, const iovec* iov, int count) {
  PASS(writev, fd, iov, count);
}
ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  PASS(recv, fd, buffer, length, flags);
}
ssize_t __recv_chk(int fd, void* buffer, size_t length, size_t buffer_length, int flags) {
  PASS(__recv_chk, fd, buffer, length, buffer_length, flags);
}
ssize_t send(int fd, const void* buffer, size_t length, int flags) {
  PASS(send, fd, buffer, length, flags);
}
ssize_t recvfrom(int fd, void* buffer, size_t length, int flags, sockaddr* address,
                 socklen_t* address_length) {
  PASS(recvfrom, fd, buffer, length, flags, address, address_length);
}
ssize_t __recvfrom_chk(int fd, void* buffer, size_t length, size_t buffer_length, int flags,
                       sockaddr* address, socklen_t* address_length) {
  PASS(__recvfrom_chk, fd, buffer, length, buffer_length, flags, address, address_length);
}
ssize_t sendto(int fd, const void* buffer, size_t length, int flags, const sockaddr* address,
               socklen_t address_length) {
  PASS(sendto, fd, buffer, length, flags, address, address_length);
}
ssize_t recvmsg(int fd, msghdr* message, int flags) {
  PASS(recvmsg, fd, message, flags);
}
ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  PASS(sendmsg, fd, message, flags);
}
int recvmmsg(int fd, mmsghdr* messages, unsigned int count, int flags, timespec* timeout) {
  PASS(recvmmsg, fd, messages, count, flags, timeout);
}
int sendmmsg(int fd, mmsghdr* messages, unsigned int count, int flags) {
  PASS(sendmmsg, fd, messages, count, flags);
}
ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  PASS(sendfile, out_fd, in_fd, offset, count);
}
ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t count) {
  PASS(sendfile64, out_fd, in_fd, offset, count);
}

int poll(pollfd* fds, nfds_t count, int timeout_ms) {
  PASS(poll, fds, count, timeout_ms);
}
int __poll_chk(pollfd* fds, nfds_t count, int timeout_ms, size_t fds_length) {
  PASS(__poll_chk, fds, count, timeout_ms, fds_length);
}
int ppoll(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask) {
  PASS(ppoll, fds, count, timeout, mask);
}
int __ppoll_chk(pollfd* fds, nfds_t count, const timespec* timeout, const sigset_t* mask,
                size_t fds_length) {
  PASS(__ppoll_chk, fds, count, timeout, mask, fds_length);
}
int select(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional, timeval* timeout) {
  PASS(select, nfds, readable, writable, exceptional, timeout);
}
int pselect(int nfds, fd_set* readable, fd_set* writable, fd_set* exceptional,
            const timespec* timeout, const sigset_t* mask) {
  PASS(pselect, nfds, readable, writable, exceptional, timeout, mask);
}
// The sockets layer knows an epoll set from its making.
int epoll_create(int size) {
  meet();
  PASS(epoll_create, size);
}
int epoll_create1(int flags) {
  meet();
  PASS(epoll_create1, flags);
}
int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
  PASS(epoll_ctl, epfd, op, fd, event);
}
int epoll_wait(int epfd, epoll_event* events, int max_events, int timeout_ms) {
  PASS(epoll_wait, epfd, events, max_events, timeout_ms);
}
int epoll_pwait(int epfd, epoll_event* events, int max_events, int timeout_ms,
                const sigset_t* mask) {
  PASS(epoll_pwait, epfd, events, max_events, timeout_ms, mask);
}

int close(int fd) {
  PASS(close, fd);
}
int shutdown(int fd, int how) {
  PASS(shutdown, fd, how);
}
int close_range(unsigned int first, unsigned int last, int flags) {
  PASS(close_range, first, last, flags);
}
void closefrom(int lowest) {
  PASS(closefrom, lowest);
}
int dup(int fd) {
  PASS(dup, fd);
}
int dup2(int fd, int target) {
  PASS(dup2, fd, target);
}
int dup3(int fd, int target, int flags) {
  PASS(dup3, fd, target, flags);
}
// fcntl's argument is an int or a pointer; a long carries either (LP64).
int fcntl(int fd, int command, ...) {
  va_list args;
  va_start(args, command);
  long argument = va_arg(args, long);
  va_end(args);
  PASS(fcntl, fd, command, argument);
}
int fcntl64(int fd, int command, ...) {
  va_list args;
  va_start(args, command);
  long argument = va_arg(args, long);
  va_end(args);
  PASS(fcntl64, fd, command, argument);
}
int ioctl(int fd, unsigned long request, ...) {
  va_list args;
  va_start(args, request);
  void* argument = va_arg(args, void*);
  va_end(args);
  PASS(ioctl, fd, request, argument);
}
int getsockopt(int fd, int level, int name, void* value, socklen_t* length) {
  PASS(getsockopt, fd, level, name, value, length);
}
int setsockopt(int fd, int level, int name, const void* value, socklen_t length) {
  PASS(setsockopt, fd, level, name, value, length);
}
int getsockname(int fd, sockaddr* address, socklen_t* length) {
  PASS(getsockname, fd, address, length);
}
int getpeername(int fd, sockaddr* address, socklen_t* length) {
  PASS(getpeername, fd, address, length);
}

int execve(const char* path, char* const argv[], char* const envp[]) {
  PASS(execve, path, argv, envp);
}
int execv(const char* path, char* const argv[]) {
  PASS(execv, path, argv);
}
int execvp(const char* file, char* const argv[]) {
  PASS(execvp, file, argv);
}
int execvpe(const char* file, char* const argv[], char* const envp[]) {
  PASS(execvpe, file, argv, envp);
}
int fexecve(int fd, char* const argv[], char* const envp[]) {
  PASS(fexecve, fd, argv, envp);
}
int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* actions,
                const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  PASS(posix_spawn, pid, path, actions, attributes, argv, envp);
}
int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* actions,
                 const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  PASS(posix_spawnp, pid, file, actions, attributes, argv, envp);
}

}  // extern "C"

namespace {
// The argument list of an execl* call, up to its null (and envp after it).
int gather(const char* first, va_list args, char** argv, int capacity, char*** envp) {
  int n = 0;
  argv[n++] = const_cast<char*>(first);
  while (n < capacity && (argv[n] = va_arg(args, char*)) != nullptr) ++n;
  if (n == capacity) return -1;
  if (envp) *envp = va_arg(args, char**);
  return n;
}
}  // namespace

extern "C" {

// The execl* forms go through the array forms above.
int execl(const char* path, const char* arg, ...) {
  char* argv[4096];
  va_list args;
  va_start(args, arg);
  int n = gather(arg, args, argv, 4096, nullptr);
  va_end(args);
  return n < 0 ? (errno = E2BIG, -1) : execv(path, argv);
}
int execlp(const char* file, const char* arg, ...) {
  char* argv[4096];
  va_list args;
  va_start(args, arg);
  int n = gather(arg, args, argv, 4096, nullptr);
  va_end(args);
  return n < 0 ? (errno = E2BIG, -1) : execvp(file, argv);
}
int execle(const char* path, const char* arg, ...) {
  char* argv[4096];
  char** envp = nullptr;
  va_list args;
  va_start(args, arg);
  int n = gather(arg, args, argv, 4096, &envp);
  va_end(args);
  return n < 0 ? (errno = E2BIG, -1) : execve(path, argv, envp);
}

// For tests and diagnostics: a one-line description of `fd` into `out`;
// returns its length, or -1 for a descriptor the library does not manage
// (all of them before the engine is loaded).
int vmmc_preload_describe(int fd, char* out, size_t length) {
  const vmmc_preload_calls* e = loaded();
  return e ? e->describe(fd, out, length) : -1;
}

}  // extern "C"
