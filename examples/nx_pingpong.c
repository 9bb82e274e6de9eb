/* examples/nx_pingpong.c: NX ping-pong between nodes 0 and 1, written only
 * against <nx.h>. Prints one-way latency and bandwidth per message size.
 *
 *   nxrun -n 2 ./nx_pingpong [max_bytes] [iterations]
 *   mpirun -n 2 ./nx_pingpong
 */
#include <nx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  long max = argc > 1 ? atol(argv[1]) : 8L << 20;
  long iterations = argc > 2 ? atol(argv[2]) : 200;
  long me = mynode();
  if (numnodes() < 2) {
    fprintf(stderr, "nx_pingpong: needs 2 nodes (nxrun -n 2 %s)\n", argv[0]);
    return 1;
  }
  char* buf = malloc((size_t)max + 1);
  memset(buf, me, (size_t)max + 1);
  if (me == 0) printf("%10s %12s %12s\n", "bytes", "latency_us", "MB/s");
  for (long size = 0; size <= max; size = size ? size * 4 : 1) {
    long n = size >= (1L << 20) ? iterations / 10 + 2 : iterations;
    gsync();
    double start = dclock();
    for (long i = 0; i < n; ++i) {
      if (me == 0) {
        csend(1, buf, size, 1, 0);
        crecv(2, buf, size);
      } else if (me == 1) {
        crecv(1, buf, size);
        csend(2, buf, size, 0, 0);
      }
    }
    double one_way = (dclock() - start) / (2.0 * (double)n);
    if (me == 0)
      printf("%10ld %12.2f %12.1f\n", size, one_way * 1e6,
             size ? (double)size / one_way / 1e6 : 0.0);
    if (size == max) break;
    if (size * 4 > max && size != max) size = max / 4; /* end exactly at max */
  }
  free(buf);
  return 0;
}
