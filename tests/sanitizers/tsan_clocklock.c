// tsan_clocklock.c: pthread_mutex_clocklock for ThreadSanitizer builds only.
//
// libstdc++ (GCC 12) implements std::timed_mutex::try_lock_for/until with
// pthread_mutex_clocklock, which neither GCC 12's nor clang 14's TSan
// runtime intercepts (LLVM added it in 18: llvm-project#62623). TSan then
// never sees those locks taken, and reports every access they protect as a
// race. This shim, preloaded into every process of the thread build's
// tests (tests/sanitizers/sanitizers.cmake), turns the call into
// pthread_mutex_timedlock, which TSan intercepts, with the same deadline.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <time.h>

int pthread_mutex_clocklock(pthread_mutex_t* mutex, clockid_t clock,
                            const struct timespec* deadline) {
  if (clock == CLOCK_REALTIME) return pthread_mutex_timedlock(mutex, deadline);
  if (clock != CLOCK_MONOTONIC) return EINVAL;
  // The same remaining time, measured on CLOCK_REALTIME.
  struct timespec now_mono, now_real, real_deadline;
  clock_gettime(CLOCK_MONOTONIC, &now_mono);
  clock_gettime(CLOCK_REALTIME, &now_real);
  long long left =
      (deadline->tv_sec - now_mono.tv_sec) * 1000000000LL + (deadline->tv_nsec - now_mono.tv_nsec);
  if (left < 0) left = 0;
  long long at = now_real.tv_sec * 1000000000LL + now_real.tv_nsec + left;
  real_deadline.tv_sec = (time_t)(at / 1000000000LL);
  real_deadline.tv_nsec = (long)(at % 1000000000LL);
  return pthread_mutex_timedlock(mutex, &real_deadline);
}
