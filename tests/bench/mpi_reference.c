/* tests/bench/mpi_reference.c: the Open MPI side of `vmmc-bench nx`: the
 * loops of nx_node.c with MPI_Send/MPI_Recv, MPI_Allreduce (one double,
 * MPI_SUM) and MPI_Barrier, printing the same lines on rank 0.
 * Usage: mpirun -n N mpi_reference <quick 0|1> <bytes,bytes,...>
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double target;
static int me, nodes;

static void share(long* n) {
  MPI_Bcast(n, 1, MPI_LONG, 0, MPI_COMM_WORLD);
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
  double start = MPI_Wtime();
  for (long i = 0; i < n; ++i) {
    if (me == 0) {
      MPI_Send(buf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
      MPI_Recv(buf, (int)size, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, (int)size, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
    }
  }
  return (MPI_Wtime() - start) / (2.0 * (double)n) * 1e6;
}

static double collective(int which, long n) {
  double x = 1.0, sum;
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (long i = 0; i < n; ++i) {
    if (which == 0)
      MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    else
      MPI_Barrier(MPI_COMM_WORLD);
  }
  return (MPI_Wtime() - start) / (double)n * 1e6;
}

static long iterations(double probe_us) {
  long n = (long)(target * 1e6 / (probe_us > 0.01 ? probe_us : 0.01));
  return n < 5 ? 5 : n > 200000 ? 200000 : n;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &nodes);
  int quick = argc > 1 && atoi(argv[1]);
  const char* sizes = argc > 2 ? argv[2] : "0,1024,1048576";
  long max = 0;
  for (const char* p = sizes; p; p = strchr(p, ',')) {
    long v = atol(*p == ',' ? ++p : p);
    if (v > max) max = v;
  }
  target = quick ? 0.02 : 0.15;
  char* buf = calloc(1, (size_t)max + 1);
  if (nodes == 2) {
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
      if (me == 0) printf("pingpong %ld %.4f\n", size, median3(a, b, c));
    }
  }
  for (int which = 0; which < 2; ++which) {
    collective(which, 10);
    long n = iterations(collective(which, 20));
    share(&n);
    double a = collective(which, n), b = collective(which, n), c = collective(which, n);
    if (me == 0)
      printf("%s %d %.4f\n", which == 0 ? "gdsum" : "gsync", which == 0, median3(a, b, c));
  }
  fflush(stdout);
  free(buf);
  MPI_Finalize();
  return 0;
}
