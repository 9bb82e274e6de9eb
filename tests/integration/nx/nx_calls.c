/* tests/integration/nx/nx_calls.c: the calls issue 18 added to <nx.h>, from
 * C, checked for their results (values received, handler arguments, error
 * codes and their NX values). Run on 2 or more nodes by test_nx.cc under
 * nxrun and under mpirun; a failed check prints where and exits with 3. */
#include <errno.h>
#include <nx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long me, n;

#define CHECK(cond)                                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "node %ld: %s:%d: CHECK(%s) failed\n", me, __FILE__, __LINE__, #cond); \
      exit(3);                                                                               \
    }                                                                                        \
  } while (0)
#define FAILS_WITH(call, code) CHECK((call) == -1 && errno == (code))

static void error_values(void) {
  /* NX's names with the iPSC/2 values. */
  CHECK(EQDRVERR == 150 && EQPBUF == 151 && EQBLEN == 152 && EQLEN == 153 && EQTIME == 154);
  CHECK(EQMSGLONG == 155 && EQPID == 156 && EQNODE == 157 && EQTYPE == 158 && EQMID == 159);
  CHECK(EQHND == 160 && EQNOPROC == 161 && EQUSEPID == 162 && EQPARAM == 165 && EQMEM == 171);
  CHECK(EQNOMID == 174 && EQSET == 175 && EQNOSET == 176 && EQBADNODE == 199);
  CHECK(EQNODEGONE == EQBADNODE && EQNOMEM == EQMEM && EQFAIL == EQDRVERR);
  char b[8];
  FAILS_WITH(_csend(1, NULL, 5, 0, 0), EQPBUF);
  FAILS_WITH(_csend(1, b, -1, 0, 0), EQLEN);
  FAILS_WITH(_csend(1, b, 0, n, 0), EQNODE);
  FAILS_WITH(_csend(1, b, 0, myhost(), 0), EQNODE);
  FAILS_WITH(_csend(-2, b, 0, 0, 0), EQTYPE);
  FAILS_WITH(_crecv(1, NULL, 4), EQPBUF);
  FAILS_WITH(_msgwait(987654), EQMID);
  FAILS_WITH(_msgdone(987654), EQMID);
  FAILS_WITH(_setptype(-3), EQPID);
  FAILS_WITH(_iprobex(1, 0, -5, NULL), EQPID);
  FAILS_WITH(_iprobex(1, n + 1, -1, NULL), EQNODE);
  FAILS_WITH(_hrecv(1, b, 8, NULL), EQHND);
  FAILS_WITH(_hsend(1, b, 8, 0, 0, NULL), EQHND);
  FAILS_WITH(_gdsum(NULL, 3, NULL), EQPBUF);
  FAILS_WITH(_gsendx(1, b, 0, NULL, 2), EQPARAM);
  long bad_list[2] = {0, n};
  FAILS_WITH(_gsendx(1, b, 0, bad_list, 2), EQNODE);
  FAILS_WITH(_flushmsg(-2, -1, -1), EQTYPE);
  FAILS_WITH(_killcube(n + 5, 0), EQNODE);
  FAILS_WITH(_msgmerge(987654, 987655), EQMID);
  FAILS_WITH(nx_initve("", n + 1, "", NULL, NULL), EQPARAM);
  FAILS_WITH(nx_nfork(NULL, -1, 0, NULL), EQNOPROC);

  /* nx_perror: the NX text of errno, after the caller's prefix. */
  FILE* out = tmpfile();
  CHECK(out != NULL);
  int saved = dup(2);
  CHECK(dup2(fileno(out), 2) == 2);
  errno = EQMID;
  nx_perror("here");
  errno = EQBADNODE;
  nx_perror("there");
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char text[200] = {0};
  rewind(out);
  CHECK(fread(text, 1, sizeof text - 1, out) > 0);
  fclose(out);
  const char* expected = "here: invalid message id\nthere: node not responding";
  CHECK(strncmp(text, expected, strlen(expected)) == 0);
}

static void environment(void) {
  int argc = 1;
  char* argv[] = {"nx_calls", NULL};
  CHECK(nx_initve("", 0, "", &argc, argv) == n);
  CHECK(nx_initve(NULL, n, NULL, &argc, argv) == n);
  CHECK(nx_initve_rect("", 0, 1, n, "", &argc, argv) == n);
  nx_nodes_t list = NULL;
  unsigned long count = 0;
  CHECK(nx_app_nodes(0, &list, &count) == 0 && count == (unsigned long)n);
  for (long i = 0; i < n; ++i) CHECK(list[i] == i);
  free(list);
  long rows = 0, cols = 0;
  CHECK(nx_app_rect(&rows, &cols) == 0 && rows == 1 && cols == n);
  rows = cols = 0;
  CHECK(mypart(&rows, &cols) == 0 && rows * cols == n);
  CHECK(myhost() == n && HOST == n && _myhost() == n);
  CHECK(_mynode() == me && _numnodes() == n && _myptype() == myptype());
  CHECK(mypid() == myptype());
  long dim = nodedim();
  CHECK((1L << dim) >= n && (dim == 0 || (1L << (dim - 1)) < n) && _nodedim() == dim);
  CHECK(gray(5) == 7 && _gray(6) == 5);
  for (long i = 0; i < 64; ++i) CHECK(ginv(gray(i)) == i && _ginv(_gray(i)) == i);
  led(1);
  CHECK(_led(0) == 0);
  /* hwclock: 10 MHz ticks, in step with dclock. */
  esize_t t0, t1;
  double d0 = dclock();
  hwclock(&t0);
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  CHECK(_hwclock(&t1) == 0);
  double d1 = _dclock();
  double ticks = ((double)t1.shigh - t0.shigh) * 4294967296.0 + ((double)t1.slow - t0.slow);
  CHECK(ticks >= 0.020 * HWHZ && ticks <= (d1 - d0) * HWHZ + 1000);
  CHECK(_mclock() >= mclock() - 1);
  CHECK(_flick() == 0);
  CHECK(_masktrap(1) == 0 && _masktrap(0) == 1);
}

static long handled_type = -1, handled_count = -1, handled_node = -1, handled_param = -1;
static void on_message(long type, long count, long node, long ptype) {
  (void)ptype;
  handled_type = type;
  handled_count = count;
  handled_node = node;
}
static void on_message_x(long type, long count, long node, long ptype, long hparam) {
  on_message(type, count, node, ptype);
  handled_param = hparam;
}
/* Handlers may run on the library's thread while this one computes: what
   they write is read with the trap masked, as NX code guards such data. */
static long read_masked(const long* value) {
  long was = masktrap(1);
  long v = *value;
  masktrap(was);
  return v;
}
static void flick_until(const long* value, long expected) {
  for (long i = 0; i < 1000000 && read_masked(value) != expected; ++i) flick();
  CHECK(read_masked(value) == expected);
}

static void messages(void) {
  /* _crecv returns 0; the length is infocount() (issue 18 item 5). */
  long v = 0;
  if (me == 0) {
    v = 4242;
    csend(10, (char*)&v, sizeof v, 1, 0);
  } else if (me == 1) {
    CHECK(_crecv(10, (char*)&v, sizeof v) == 0 && v == 4242);
    CHECK(_infocount() == sizeof v && _infonode() == 0 && _infotype() == 10);
    CHECK(_infoptype() == 0 && infopid() == 0 && _infopid() == 0);
    csend(11, (char*)&v, 3, 0, 0);
    csend(12, NULL, 0, 0, 0);
  }
  if (me == 0) {
    char b[8];
    long info[8];
    CHECK(_crecvx(11, b, 8, 1, -1, info) == 0 && info[NX_INFO_COUNT] == 3);
    CHECK(_crecv(12, NULL, 0) == 0 && infocount() == 0);
  }
  gsync();

  /* msgmerge: one mid for two receives and a send. */
  if (me == 0) {
    long a = 0, b = 0, out = 77;
    long mid = msgmerge(-1, irecv(20, (char*)&a, sizeof a));
    CHECK(msgmerge(mid, irecv(21, (char*)&b, sizeof b)) == mid);
    CHECK(_msgmerge(mid, isend(22, (char*)&out, sizeof out, 1, 0)) == mid);
    msgwait(mid);
    CHECK(a == 1 && b == 2);
    FAILS_WITH(_msgwait(mid), EQMID);
    long c = 0, d = 0;
    long mid2 = msgmerge(irecv(23, (char*)&c, sizeof c), irecv(24, (char*)&d, sizeof d));
    while (!msgdone(mid2)) {
    }
    CHECK(c == 3 && d == 4);
  } else if (me == 1) {
    long vals[4] = {1, 2, 3, 4}, got = 0;
    csend(21, (char*)&vals[1], sizeof(long), 0, 0); /* out of order: both are posted */
    csend(20, (char*)&vals[0], sizeof(long), 0, 0);
    crecv(22, (char*)&got, sizeof got);
    CHECK(got == 77);
    csend(24, (char*)&vals[3], sizeof(long), 0, 0);
    csend(23, (char*)&vals[2], sizeof(long), 0, 0);
  }
  gsync();

  /* hsend/hsendx: the handler gets the sent message's description. */
  if (me == 1) {
    static char data[100];
    hsend(30, data, 100, 0, 0, on_message);
    flick_until(&handled_type, 30);
    CHECK(handled_count == 100 && handled_node == 0);
    CHECK(_hsendx(31, data, 5, 0, 0, on_message_x, 99) == 0);
    flick_until(&handled_param, 99);
    CHECK(handled_type == 31 && handled_count == 5);
  } else if (me == 0) {
    char b[100];
    crecv(30, b, 100);
    crecv(31, b, 100);
    CHECK(infocount() == 5);
  }
  gsync();

  /* hsendrecv: the handler runs when the reply is in. */
  if (me == 1) {
    long q = 6, reply = 0;
    handled_type = -1;
    hsendrecv(40, (char*)&q, sizeof q, 0, 0, 41, (char*)&reply, sizeof reply, on_message);
    flick_until(&handled_type, 41);
    CHECK(reply == 36 && handled_node == 0);
  } else if (me == 0) {
    long q = 0;
    crecv(40, (char*)&q, sizeof q);
    q *= q;
    csend(41, (char*)&q, sizeof q, 1, 0);
  }
  gsync();

  /* gsendx: node 0 to every other node, listed backwards. */
  if (me == 0) {
    long list[64], k = 0, value = 555;
    for (long j = n - 1; j > 0; --j) list[k++] = j;
    gsendx(50, (char*)&value, sizeof value, list, k);
  } else {
    long value = 0;
    crecv(50, (char*)&value, sizeof value);
    CHECK(value == 555 && infonode() == 0);
  }
  gsync();

  /* flushmsg: what has arrived goes, the rest stays. */
  if (me == 0) {
    long x = 1;
    for (int i = 0; i < 3; ++i) csend(60, (char*)&x, sizeof x, 1, 0);
    x = 61;
    csend(61, (char*)&x, sizeof x, 1, 0);
  }
  gsync(); /* node 0's messages to node 1 came before its part of gsync */
  if (me == 1) {
    CHECK(iprobe(60) == 1);
    flushmsg(60, -1, -1);
    CHECK(iprobe(60) == 0 && iprobe(61) == 1);
    CHECK(_flushmsg(62, 0, -1) == 0);
    long x = 0;
    crecv(61, (char*)&x, sizeof x);
    CHECK(x == 61);
  }
  gsync();
}

int main(void) {
  me = mynode();
  n = numnodes();
  CHECK(n >= 2);
  error_values();
  environment();
  messages();
  if (me == 0) printf("nx_calls: %ld nodes ok\n", n);
  return 0;
}
