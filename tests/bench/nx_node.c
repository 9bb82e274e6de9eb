/* tests/bench/nx_node.c: the NX side of `vmmc-bench nx`, one job of N nodes
 * (started by nxrun). mpi_reference.c is the same program over MPI; the two
 * run the same loops and print the same lines on node 0:
 *   pingpong <bytes> <one-way us>     (nodes 0 and 1; csend/crecv)
 *   gdsum 1 <us per call>             (one double, all nodes)
 *   gsync 0 <us per call>
 * Usage: nx_node <quick 0|1> <bytes,bytes,...>
 * Each figure is the median of 3 repeats of a loop sized to ~target seconds.
 */
#include <nx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double target;

static void share(long* n) { /* node 0's choice, to everyone */
  if (mynode() == 0)
    csend(9, (char*)n, sizeof *n, -1, 0);
  else
    crecv(9, (char*)n, sizeof *n);
}

static double median3(double a, double b, double c) {
  if (a > b) {
    double t = a;
    a = b;
    b = t;
  }
  if (b > c) b = c;
  return a > b ? a : b;
}

static double pingpong(char* buf, long size, long n) {
  double start = dclock();
  for (long i = 0; i < n; ++i) {
    if (mynode() == 0) {
      csend(1, buf, size, 1, 0);
      crecv(2, buf, size);
    } else {
      crecv(1, buf, size);
      csend(2, buf, size, 0, 0);
    }
  }
  return (dclock() - start) / (2.0 * (double)n) * 1e6;
}

static double collective(int which, long n) {
  double x = 1.0, work;
  gsync();
  double start = dclock();
  for (long i = 0; i < n; ++i) {
    if (which == 0)
      gdsum(&x, 1, &work);
    else
      gsync();
  }
  return (dclock() - start) / (double)n * 1e6;
}

static long iterations(double probe_us) {
  long n = (long)(target * 1e6 / (probe_us > 0.01 ? probe_us : 0.01));
  return n < 5 ? 5 : n > 200000 ? 200000 : n;
}

int main(int argc, char** argv) {
  int quick = argc > 1 && atoi(argv[1]);
  const char* sizes = argc > 2 ? argv[2] : "0,1024,1048576";
  long max = 0;
  for (const char* p = sizes; p; p = strchr(p, ',')) {
    long v = atol(*p == ',' ? ++p : p);
    if (v > max) max = v;
  }
  target = quick ? 0.02 : 0.15;
  char* buf = calloc(1, (size_t)max + 1);
  if (numnodes() == 2 && mynode() <= 1) {
    for (const char* p = sizes; p; p = strchr(p + 1, ',')) {
      long size = atol(*p == ',' ? p + 1 : p);
      /* Warm-up (rings, caches): up to 1000 round trips, never longer than
         a measurement (a round trip of milliseconds, as when both processes
         share one CPU, would make it seconds). */
      pingpong(buf, size, 5);
      long n = iterations(pingpong(buf, size, 5));
      share(&n);
      long warm = size < 65536 ? 1000 : 20;
      pingpong(buf, size, warm < n ? warm : n);
      double a = pingpong(buf, size, n), b = pingpong(buf, size, n), c = pingpong(buf, size, n);
      if (mynode() == 0) printf("pingpong %ld %.4f\n", size, median3(a, b, c));
    }
  }
  for (int which = 0; which < 2; ++which) {
    collective(which, 10);
    long n = iterations(collective(which, 20));
    share(&n);
    double a = collective(which, n), b = collective(which, n), c = collective(which, n);
    if (mynode() == 0)
      printf("%s %d %.4f\n", which == 0 ? "gdsum" : "gsync", which == 0, median3(a, b, c));
  }
  fflush(stdout);
  free(buf);
  return 0;
}
