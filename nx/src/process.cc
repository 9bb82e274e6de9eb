// nx/src/process.cc: NX's process-management and environment calls that
// have a meaning in a job whose nodes the launcher (nxrun, mpirun) started:
// joining the job (nx_initve), the job's shape (nx_app_nodes, nx_app_rect,
// mypart, nodedim), the host node, the iPSC gray code, the clocks. Creating
// processes (nx_nfork) fails with EQNOPROC: each node holds one process,
// fixed at start.
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "nx.h"
#include "runtime.h"

namespace {

using vmmc::nx::detail::checked;
using vmmc::nx::detail::or_die;
using vmmc::nx::detail::runtime;

long nodes() {
  return runtime::instance().nodes();
}

// The job is made; asking for a given size checks it (0: whatever it has).
long join(long size) {
  const long n = nodes();
  return checked(size == 0 || size == n ? 0 : EQPARAM, n);
}

}  // namespace

extern "C" {

long nx_initve(char* partition, long size, char* account, int* argc, char** argv) {
  (void)partition, (void)account, (void)argc, (void)argv;
  return join(size);
}
long nx_initve_rect(char* partition, long anchor, long rows, long cols, char* account, int* argc,
                    char** argv) {
  (void)partition, (void)anchor, (void)account, (void)argc, (void)argv;
  return rows < 0 || cols < 0 ? checked(EQPARAM) : join(rows * cols);
}
long nx_nfork(long node_list[], long list_size, long ptype, long pid_list[]) {
  (void)node_list, (void)list_size, (void)ptype, (void)pid_list;
  return checked(EQNOPROC);
}

long nx_app_nodes(pid_t app, nx_nodes_t* node_list, unsigned long* list_size) {
  if (app != 0 && app != ::getpid()) return checked(EQPARAM);
  if (!node_list || !list_size) return checked(EQPBUF);
  const long n = nodes();
  auto* list = static_cast<long*>(std::malloc(sizeof(long) * static_cast<std::size_t>(n)));
  if (!list) return checked(EQMEM);
  for (long i = 0; i < n; ++i) list[i] = i;
  *node_list = list;
  *list_size = static_cast<unsigned long>(n);
  return 0;
}
long nx_app_rect(long* rows, long* cols) {
  if (!rows || !cols) return checked(EQPBUF);
  *rows = 1;
  *cols = nodes();
  return 0;
}
long mypart(long* rows, long* cols) {
  return nx_app_rect(rows, cols);
}

long myhost(void) {
  return nodes();
}
long _myhost(void) {
  return myhost();
}

long nodedim(void) {
  long d = 0;
  while ((1L << d) < nodes()) ++d;
  return d;
}
long _nodedim(void) {
  return nodedim();
}
long gray(long i) {
  return i ^ (i >> 1);
}
long _gray(long i) {
  return gray(i);
}
long ginv(long g) {
  long i = 0;
  for (; g; g >>= 1) i ^= g;
  return i;
}
long _ginv(long g) {
  return ginv(g);
}

void led(long state) {
  (void)state;
}
long _led(long state) {
  (void)state;
  return 0;
}

void hwclock(esize_t* t) {
  (void)_hwclock(t);
}
long _hwclock(esize_t* t) {
  if (!t) return checked(EQPBUF);
  using namespace std::chrono;
  const auto ticks = static_cast<unsigned long long>(
      duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count() /
      (1000000000LL / HWHZ));
  t->slow = static_cast<long>(ticks & 0xffffffffULL);
  t->shigh = static_cast<long>(ticks >> 32);
  return 0;
}

}  // extern "C"
