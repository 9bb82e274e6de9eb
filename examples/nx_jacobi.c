/* examples/nx_jacobi.c: Jacobi relaxation of Laplace's equation on an
 * N x N grid, rows distributed in blocks over the nodes, written only
 * against <nx.h>. Each sweep exchanges boundary rows with the neighbours
 * (isend/crecvx); gdhigh finds the largest change and gdsum the grid's sum. At the end node 0
 * gathers the blocks (crecvx per node) and checks the grid against the same relaxation done
 * serially.
 *
 *   nxrun -n 4 ./nx_jacobi [N] [sweeps]        exit status 0 when the check passes
 */
#include <math.h>
#include <nx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { type_up = 1, type_down = 2, type_gather = 3 };

static double boundary(long i, long j, long n) {
  /* Fixed edges: hot top row, cold elsewhere, a warm left column. */
  if (i == 0) return 100.0;
  if (j == 0) return 50.0 * (double)(n - 1 - i) / (double)(n - 1);
  return 0.0;
}

static void serial(double* g, long n, long sweeps) {
  double* next = malloc(sizeof(double) * (size_t)(n * n));
  memcpy(next, g, sizeof(double) * (size_t)(n * n));
  for (long s = 0; s < sweeps; ++s) {
    for (long i = 1; i < n - 1; ++i)
      for (long j = 1; j < n - 1; ++j)
        next[i * n + j] =
            0.25 * (g[(i - 1) * n + j] + g[(i + 1) * n + j] + g[i * n + j - 1] + g[i * n + j + 1]);
    memcpy(g, next, sizeof(double) * (size_t)(n * n));
  }
  free(next);
}

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 256, sweeps = argc > 2 ? atol(argv[2]) : 200;
  long me = mynode(), p = numnodes();
  if (n < p + 2) n = p + 2;
  /* Interior rows 1..n-2 split into p blocks; each node keeps ghost rows. */
  long interior = n - 2, base = interior / p, extra = interior % p;
  long first = 1 + me * base + (me < extra ? me : extra);
  long rows = base + (me < extra ? 1 : 0);
  double* u = calloc((size_t)((rows + 2) * n), sizeof(double));
  double* v = calloc((size_t)((rows + 2) * n), sizeof(double));
  for (long r = 0; r < rows + 2; ++r)
    for (long j = 0; j < n; ++j) u[r * n + j] = v[r * n + j] = boundary(first - 1 + r, j, n);
  for (long r = 1; r <= rows; ++r) u[r * n + n - 1] = v[r * n + n - 1] = 0.0;

  double start = dclock(), change = 0.0;
  for (long s = 0; s < sweeps; ++s) {
    /* Ghost rows: send my first row up and my last row down. */
    long up = -1, down = -1;
    if (me > 0) up = isend(type_up, (char*)&u[1 * n], n * (long)sizeof(double), me - 1, 0);
    if (me < p - 1)
      down = isend(type_down, (char*)&u[rows * n], n * (long)sizeof(double), me + 1, 0);
    if (me > 0) crecvx(type_down, (char*)&u[0], n * (long)sizeof(double), me - 1, -1, NULL);
    if (me < p - 1)
      crecvx(type_up, (char*)&u[(rows + 1) * n], n * (long)sizeof(double), me + 1, -1, NULL);
    if (up >= 0) msgwait(up);
    if (down >= 0) msgwait(down);
    double local = 0.0, work;
    for (long r = 1; r <= rows; ++r)
      for (long j = 1; j < n - 1; ++j) {
        double x =
            0.25 * (u[(r - 1) * n + j] + u[(r + 1) * n + j] + u[r * n + j - 1] + u[r * n + j + 1]);
        if (fabs(x - u[r * n + j]) > local) local = fabs(x - u[r * n + j]);
        v[r * n + j] = x;
      }
    gdhigh(&local, 1, &work);
    change = local;
    double* t = u;
    u = v;
    v = t;
  }
  double sum = 0.0, work;
  for (long r = 1; r <= rows; ++r)
    for (long j = 0; j < n; ++j) sum += u[r * n + j];
  gdsum(&sum, 1, &work);
  double elapsed = dclock() - start;

  int ok = 1;
  if (me != 0) {
    csend(type_gather, (char*)&u[n], rows * n * (long)sizeof(double), 0, 0);
  } else {
    double* all = malloc(sizeof(double) * (size_t)(n * n));
    double* check = malloc(sizeof(double) * (size_t)(n * n));
    for (long i = 0; i < n; ++i)
      for (long j = 0; j < n; ++j) all[i * n + j] = check[i * n + j] = boundary(i, j, n);
    for (long i = 1; i < n - 1; ++i) all[i * n + n - 1] = check[i * n + n - 1] = 0.0;
    memcpy(&all[first * n], &u[n], sizeof(double) * (size_t)(rows * n));
    for (long k = 1, at = first + rows; k < p; ++k) {
      long info[4];
      crecvx(type_gather, (char*)&all[at * n], (n - 1 - at) * n * (long)sizeof(double), k, -1,
             info);
      at += info[NX_INFO_COUNT] / (n * (long)sizeof(double));
    }
    serial(check, n, sweeps);
    double worst = 0.0;
    for (long i = 0; i < n * n; ++i)
      if (fabs(all[i] - check[i]) > worst) worst = fabs(all[i] - check[i]);
    ok = worst < 1e-9;
    printf(
        "jacobi %ldx%ld, %ld sweeps on %ld nodes: %.3f s, last change %.3e, sum %.6f, "
        "max difference to serial %.1e: %s\n",
        n, n, sweeps, p, elapsed, change, sum, worst, ok ? "ok" : "WRONG");
    free(all);
    free(check);
  }
  free(u);
  free(v);
  return ok ? 0 : 1;
}
