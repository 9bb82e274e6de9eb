// tsan_fork.c: threads started in a fork() child get stacks of their own,
// for ThreadSanitizer builds only (linked and preloaded with
// tsan_clocklock.c, see cmake/warnings.cmake).
//
// Our fork() children start threads (a context of their own, as a
// preloaded pre-forking server's children do). In a child, glibc keeps the
// stacks of the parent's other threads in its cache and gives one to the
// child's next thread, whose pthread_t (the address of its descriptor, on
// that stack) is then the one of a parent thread TSan still counts as
// running: TSan dies at the join with "dup thread with used id". A child
// asks for a larger default stack than any cached one, so glibc maps a new
// one; the tests' GLIBC_TUNABLES keep the cached stacks mapped
// (tests/sanitizers/sanitizers.cmake), so it cannot land where one was.
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/resource.h>

static void larger_stacks_in_child(void) {
  pthread_attr_t attr;
  size_t size = 0;
  if (pthread_getattr_default_np(&attr) != 0) return;
  if (pthread_attr_getstacksize(&attr, &size) != 0 || size == 0) {
    struct rlimit limit;
    size = getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
               ? (size_t)limit.rlim_cur
               : (size_t)8 << 20;
  }
  // A generation of fork() further down asks for more again.
  if (pthread_attr_setstacksize(&attr, size + ((size_t)1 << 20)) == 0)
    pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
}

__attribute__((constructor)) static void install(void) {
  pthread_atfork(0, 0, larger_stacks_in_child);
}
