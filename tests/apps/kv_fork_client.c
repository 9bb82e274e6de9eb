/* tests/apps/kv_fork_client.c: an rpcgen client of the key-value service
 * (examples/kv/kv.x) that forks, built only against libtirpc; the apps matrix
 * runs it with and without libvrpc_preload.so.
 *
 *   vmmc-apps-kv-fork HOST CHILDREN CALLS SIZE
 *
 * 1. The parent makes its CLIENT (clnt_create "tcp") and stores a value.
 * 2. It forks one child that uses the INHERITED CLIENT (the parent waits), then
 *    uses that CLIENT again itself.
 * 3. It forks CHILDREN children at once; each makes a CLIENT of its own and
 *    does CALLS rounds of put + get of a SIZE-byte value (a pattern of its
 *    key and round), checking each value read back; the parent meanwhile
 *    does the same on its own CLIENT.
 * 4. The parent reads every child's last value back.
 * Prints "digest <hex>" (FNV-1a of every value read, in a fixed order) and
 * "calls/s <rate>": calls of step 3 (children and parent) over the longest
 * participant's time after its clnt_create. Exit status 0 only when every
 * call and check succeeded, in every process. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kv.h"

static const char* host;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = data;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static void fill(char* v, size_t size, const char* key, long round) {
  for (size_t i = 0; i < size; ++i) v[i] = (char)(key[i % strlen(key)] + round + (long)(i / 7));
}

static CLIENT* make(void) {
  CLIENT* c = clnt_create(host, KV_PROG, KV_VERS, "tcp");
  if (!c) clnt_pcreateerror(host);
  return c;
}

/* put + get of `key` with round r's value; adds what was read to *h. */
static int round_trip(CLIENT* c, const char* key, long r, char* v, size_t size, uint64_t* h) {
  char what[96];
  fill(v, size, key, r);
  kv_put_args args = {(char*)key, {(u_int)size, v}};
  int* ok = kv_put_1(&args, c);
  if (!ok || !*ok) {
    snprintf(what, sizeof what, "pid %d: put %s round %ld", (int)getpid(), key, r);
    clnt_perror(c, what);
    return -1;
  }
  char* k = (char*)key;
  kv_get_result* got = kv_get_1(&k, c);
  if (!got) {
    snprintf(what, sizeof what, "pid %d: get %s round %ld", (int)getpid(), key, r);
    clnt_perror(c, what);
    return -1;
  }
  int same = got->found && got->kv_get_result_u.value.kv_value_len == size &&
             memcmp(got->kv_get_result_u.value.kv_value_val, v, size) == 0;
  if (!same) {
    fprintf(stderr, "%s round %ld: wrong value back (found %d, %u bytes)\n", key, r, got->found,
            got->found ? got->kv_get_result_u.value.kv_value_len : 0);
    return -1;
  }
  *h = fnv(*h, got->kv_get_result_u.value.kv_value_val, size);
  xdr_free((xdrproc_t)xdr_kv_get_result, (char*)got);
  return 0;
}

/* Step 3 in one process: CALLS rounds on its own key; writes "<seconds> <digest>" to fd. */
static int worker(CLIENT* c, const char* key, long calls, size_t size, int fd) {
  char* v = malloc(size);
  uint64_t h = 1469598103934665603ull;
  double t0 = now();
  int rc = 0;
  for (long r = 0; r < calls && rc == 0; ++r) rc = round_trip(c, key, r, v, size, &h);
  char line[128];
  int n = snprintf(line, sizeof line, "%.6f %016llx\n", now() - t0, (unsigned long long)h);
  if (write(fd, line, (size_t)n) != n) rc = -1;
  free(v);
  return rc;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s HOST CHILDREN CALLS SIZE\n", argv[0]);
    return 2;
  }
  host = argv[1];
  int children = atoi(argv[2]);
  long calls = atol(argv[3]);
  size_t size = (size_t)atol(argv[4]);
  char* v = malloc(size);
  uint64_t h = 1469598103934665603ull;
  int status = 0;

  CLIENT* c = make(); /* 1 */
  if (!c || round_trip(c, "parent", 0, v, size, &h) != 0) return 1;

  pid_t pid = fork(); /* 2: the inherited CLIENT, while the parent waits */
  if (pid == 0) {
    uint64_t hc = 0;
    int rc =
        round_trip(c, "inherited", 1, v, size, &hc) || round_trip(c, "parent", 2, v, size, &hc);
    _exit(rc == 0 ? 0 : 1);
  }
  int ws;
  if (pid < 0 || waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    fprintf(stderr, "the child using the inherited CLIENT failed (wait status %d)\n", ws);
    status = 1;
  }
  if (round_trip(c, "parent", 3, v, size, &h) != 0) status = 1;

  int fds[2]; /* 3 */
  if (pipe(fds) != 0) return 1;
  pid_t* pids = calloc((size_t)children, sizeof *pids);
  for (int i = 0; i < children; ++i) {
    pids[i] = fork();
    if (pids[i] == 0) {
      close(fds[0]);
      char key[32];
      snprintf(key, sizeof key, "child%d", i);
      CLIENT* own = make();
      _exit(own && worker(own, key, calls, size, fds[1]) == 0 ? 0 : 1);
    }
  }
  if (worker(c, "parent-loop", calls, size, fds[1]) != 0) status = 1;
  close(fds[1]);
  for (int i = 0; i < children; ++i) {
    if (pids[i] < 0 || waitpid(pids[i], &ws, 0) != pids[i] || !WIFEXITED(ws) ||
        WEXITSTATUS(ws) != 0) {
      fprintf(stderr, "child %d failed (wait status %d)\n", i, ws);
      status = 1;
    }
  }
  /* Each participant's digest, sorted: the order they finished in varies. */
  char buf[4096] = {0};
  size_t got = 0;
  ssize_t n;
  while (got < sizeof buf - 1 && (n = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
    got += (size_t)n;
  double longest = 0;
  char digests[64][17];
  int count = 0;
  for (char* line = strtok(buf, "\n"); line && count < 64; line = strtok(NULL, "\n")) {
    double s;
    if (sscanf(line, "%lf %16s", &s, digests[count]) == 2) {
      if (s > longest) longest = s;
      ++count;
    }
  }
  if (count != children + 1) {
    fprintf(stderr, "%d of %d participants reported\n", count, children + 1);
    status = 1;
  }
  qsort(digests, (size_t)count, sizeof digests[0], (int (*)(const void*, const void*))strcmp);
  for (int i = 0; i < count; ++i) h = fnv(h, digests[i], 16);

  for (int i = 0; i < children; ++i) { /* 4 */
    char key[32];
    snprintf(key, sizeof key, "child%d", i);
    fill(v, size, key, calls - 1);
    char* k = key;
    kv_get_result* r = kv_get_1(&k, c);
    if (!r) {
      clnt_perror(c, key);
      status = 1;
      break; /* each further call would wait for its timeout too */
    } else if (!r->found || r->kv_get_result_u.value.kv_value_len != size ||
               memcmp(r->kv_get_result_u.value.kv_value_val, v, size) != 0) {
      fprintf(stderr, "%s: last value not read back\n", key);
      status = 1;
    } else {
      h = fnv(h, v, size);
    }
  }
  printf("digest %016llx\n", (unsigned long long)h);
  printf("calls/s %.0f\n", longest > 0 ? 2.0 * (double)calls * (children + 1) / longest : 0.0);
  clnt_destroy(c);
  free(pids);
  free(v);
  return status;
}
