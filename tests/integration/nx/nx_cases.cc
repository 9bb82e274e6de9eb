// tests/integration/nx/nx_cases.cc: NX test program, started by nxrun or
// mpirun (test_nx.cc drives it). `nx_cases <suite>` runs one suite on every
// node; a failed check prints where and exits with status 3, which ends the
// job with an error.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <nx.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/fault.h"
#include "support/interposer.h"
#include "time_scale.h"

namespace {

long me, nodes;

#define CHECK(cond)                                                                               \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "node %ld: %s:%d: CHECK(%s) failed\n", me, __FILE__, __LINE__, #cond); \
      std::exit(3);                                                                               \
    }                                                                                             \
  } while (0)

char* ptr(void* p) {
  return static_cast<char*>(p);
}
char pattern(long seed, long i) {
  return static_cast<char>((seed * 131 + i * 7) & 0xff);
}
std::vector<char> payload(long seed, long n) {
  std::vector<char> v(static_cast<std::size_t>(n));
  for (long i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = pattern(seed, i);
  return v;
}
bool is_payload(const char* p, long seed, long n) {
  for (long i = 0; i < n; ++i)
    if (p[i] != pattern(seed, i)) return false;
  return true;
}

// ---------------------------------------------------------------- point to point

void basic_and_selection() {
  // Exact and -1 type selection, node selection, msginfo and info[].
  if (me == 0) {
    auto a = payload(1, 100), b = payload(2, 200000);
    csend(10, a.data(), 100, 1, 0);
    csend(11, b.data(), 200000, 1, 0);
    csend(12, nullptr, 0, 1, 0);
  } else if (me == 1) {
    std::vector<char> buf(200000);
    crecv(11, buf.data(), 200000);  // exact type: skips the earlier type 10
    CHECK(is_payload(buf.data(), 2, 200000));
    CHECK(infotype() == 11 && infocount() == 200000 && infonode() == 0 && infoptype() == 0);
    long info[8] = {};
    crecvx(-1, buf.data(), 1000, 0, -1, info);  // any type: the waiting type 10
    CHECK(info[NX_INFO_TYPE] == 10 && info[NX_INFO_COUNT] == 100 && info[NX_INFO_NODE] == 0);
    CHECK(is_payload(buf.data(), 1, 100));
    crecvx(12, buf.data(), 0, -1, 0, info);
    CHECK(info[NX_INFO_COUNT] == 0 && msginfo[NX_INFO_TYPE] == 12);
  }
  gsync();
}

void node_selection_and_broadcast() {
  // Node -1 sends to every other node; crecvx selects by node.
  std::vector<char> buf(64);
  if (me == 0) {
    auto a = payload(3, 64);
    csend(20, a.data(), 64, -1, 0);
  } else {
    long info[4];
    crecvx(20, buf.data(), 64, 0, -1, info);
    CHECK(is_payload(buf.data(), 3, 64) && info[NX_INFO_NODE] == 0);
  }
  // Everyone sends type 21 to the last node, which takes them in node order.
  long last = nodes - 1;
  if (me != last) {
    long value = me * 1000;
    csend(21, ptr(&value), sizeof value, last, 0);
  } else {
    for (long from = nodes - 2; from >= 0; --from) {
      long value = -1;
      crecvx(21, ptr(&value), sizeof value, from, -1, nullptr);
      CHECK(value == from * 1000 && infonode() == from);
    }
  }
  gsync();
}

void probes() {
  if (me == 0) {
    gsync();
    auto a = payload(4, 3000);
    csend(30, a.data(), 3000, 1, 0);
    gsync();
  } else if (me == 1) {
    CHECK(iprobe(30) == 0);
    gsync();
    cprobe(30);
    CHECK(infocount() == 3000 && infonode() == 0 && infotype() == 30);
    long info[4] = {};
    long found = iprobex(-1, 0, -1, info);
    CHECK(found == 1 && info[NX_INFO_COUNT] == 3000);
    CHECK(iprobex(30, 0, 5, info) == 0);  // ptype 5 selects nothing
    cprobex(-1, -1, -1, info);
    CHECK(info[NX_INFO_TYPE] == 30);
    std::vector<char> buf(3000);
    crecv(30, buf.data(), 3000);
    CHECK(is_payload(buf.data(), 4, 3000));
    CHECK(iprobe(30) == 0);
    gsync();
  } else {
    gsync();
    gsync();
  }
}

void asynchronous() {
  std::vector<char> buf(1 << 20);
  if (me == 0) {
    auto a = payload(5, 1 << 20);
    long mid = isend(40, a.data(), 1 << 20, 1, 0);
    msgwait(mid);
    long mid2 = isend(41, a.data(), 10, 1, 0);
    while (!msgdone(mid2)) {
    }
    CHECK(_msgwait(mid2) == -1 && errno == EQMID);  // released by msgdone
  } else if (me == 1) {
    long info[4] = {};
    long mid = irecvx(40, buf.data(), 1 << 20, 0, -1, info);
    char small[10];
    long mid2 = irecv(41, small, 10);
    msgwait(mid);
    CHECK(info[NX_INFO_COUNT] == (1 << 20) && infocount() == (1 << 20));
    CHECK(is_payload(buf.data(), 5, 1 << 20));
    while (!msgdone(mid2)) {
    }
    CHECK(infocount() == 10 && is_payload(small, 5, 10));
  }
  gsync();
}

void many_outstanding() {
  // 1,000 isends and 1,000 irecvs in flight at once, sizes 0 .. 64 KiB.
  const long count = 1000;
  auto size_of = [](long i) { return (i * 977) % 65536; };
  if (me == 0 || me == 1) {
    long peer = 1 - me;
    std::vector<std::vector<char>> out(count), in(count);
    std::vector<long> mids;
    for (long i = 0; i < count; ++i) {
      in[static_cast<std::size_t>(i)].resize(static_cast<std::size_t>(size_of(i)) + 1);
      mids.push_back(irecv(1000 + i, in[static_cast<std::size_t>(i)].data(), size_of(i)));
    }
    for (long i = 0; i < count; ++i) {
      out[static_cast<std::size_t>(i)] = payload(me * count + i, size_of(i));
      mids.push_back(isend(1000 + i, out[static_cast<std::size_t>(i)].data(), size_of(i), peer, 0));
      mids.push_back(isend(3000 + i, nullptr, 0, peer, 0));
    }
    for (long mid : mids) msgwait(mid);
    for (long i = 0; i < count; ++i)
      CHECK(is_payload(in[static_cast<std::size_t>(i)].data(), peer * count + i, size_of(i)));
    // The empty messages sent alongside wait unreceived; take them in reverse.
    for (long i = count - 1; i >= 0; --i) crecv(3000 + i, nullptr, 0);
  }
  gsync();
}

void fifo_order() {
  if (me == 0) {
    for (long i = 0; i < 200; ++i) {
      long size = (i % 7 == 0) ? 300000 : 8;
      std::vector<char> a = payload(i, size);
      csend(50, a.data(), size, 1, 0);
    }
  } else if (me == 1) {
    std::vector<char> buf(300000);
    for (long i = 0; i < 200; ++i) {
      crecv(-1, buf.data(), 300000);
      long size = (i % 7 == 0) ? 300000 : 8;
      CHECK(infocount() == size && is_payload(buf.data(), i, size));
    }
  }
  gsync();
}

void small_messages_overflow_the_mailbox() {
  // 300 messages sent before any is received: more than the 64 mailbox
  // slots, with sizes on both sides of the mailbox's 1048-byte limit, so they
  // travel both paths. They must arrive whole and in send order.
  const long count = 300;
  auto size_of = [](long i) { return (i * 37) % 1200; };
  if (me == 0) {
    for (long i = 0; i < count; ++i) {
      std::vector<char> a = payload(i, size_of(i));
      csend(60, a.data(), size_of(i), 1, 0);
    }
    csend(61, nullptr, 0, 1, 0);
  } else if (me == 1) {
    // Not calling into NX for a while lets the sender fill every slot first.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    crecv(61, nullptr, 0);  // everything before it is in by now
    std::vector<char> buf(1200);
    for (long i = 0; i < count; ++i) {
      crecv(60, buf.data(), 1200);
      CHECK(infocount() == size_of(i) && is_payload(buf.data(), i, size_of(i)));
    }
  }
  gsync();
}

void force_types() {
  const long force = NX_FORCE_TYPE | 60;
  char buf[16] = {};
  if (me == 0) {
    char x[16] = "first";
    csend(force, x, 16, 1, 0);  // node 1 has no receive for it: dropped
    csend(61, x, 16, 1, 0);
    gsync();  // node 1 posts irecv(force) and irecv(-1) before this
    char y[16] = "second";
    csend(force, y, 16, 1, 0);
    csend(62, y, 16, 1, 0);
    gsync();
  } else if (me == 1) {
    crecv(61, buf, 16);  // the FORCE message came first and found no receive
    CHECK(iprobe(force) == 0);
    long any = irecv(-1, buf, 16);  // -1 never selects a FORCE type
    char fbuf[16] = {};
    long forced = irecv(force, fbuf, 16);
    gsync();
    msgwait(forced);
    CHECK(std::strcmp(fbuf, "second") == 0 && infotype() == force);
    msgwait(any);
    CHECK(infotype() == 62);
    gsync();
  } else {
    gsync();
    gsync();
  }
}

long handled_type = -1, handled_count = -1, handled_node = -1, handled_param = -1;
void handler(long type, long count, long node, long) {
  handled_type = type, handled_count = count, handled_node = node;
}
void handlerx(long type, long, long, long, long hparam) {
  handled_type = type, handled_param = hparam;
}

void handlers() {
  char buf[32] = {};
  if (me == 0) {
    gsync();
    csend(70, ptr(const_cast<char*>("hello")), 6, 1, 0);
    gsync();
    csend(71, ptr(const_cast<char*>("x")), 2, 1, 0);
    gsync();
  } else if (me == 1) {
    CHECK(masktrap(1) == 0);
    hrecv(70, buf, sizeof buf, handler);
    gsync();
    gsync();  // the message came before this (pairwise order) but is masked
    CHECK(handled_type == -1);
    CHECK(masktrap(0) == 1);  // unmasking runs it
    CHECK(handled_type == 70 && handled_count == 6 && handled_node == 0);
    CHECK(std::strcmp(buf, "hello") == 0);
    hrecvx(71, buf, sizeof buf, 0, -1, handlerx, 1234);
    gsync();
    for (double end = dclock() + 10; handled_param != 1234 && dclock() < end;) flick();
    CHECK(handled_type == 71 && handled_param == 1234);
  } else {
    gsync();
    gsync();
    gsync();
  }
}

void errors_and_limits() {
  // Message too long: the first bytes land, EQMSGLONG, msginfo has the length.
  if (me == 0) {
    auto a = payload(8, 100);
    csend(80, a.data(), 100, 1, 0);
    csend(81, a.data(), 100, 1, 0);
  } else if (me == 1) {
    char small[10] = {};
    CHECK(_crecv(80, small, 10) == -1 && errno == EQMSGLONG);
    CHECK(is_payload(small, 8, 10) && infocount() == 100);
    long mid = _irecv(81, small, 10);
    CHECK(mid > 0 && _msgwait(mid) == -1 && errno == EQMSGLONG);
  }
  // The same while the receiver already waits (its mailbox fast path), and
  // a message it does not want arriving first (left to the general path).
  gsync();
  if (me == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto a = payload(9, 100);
    csend(82, a.data(), 100, 1, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    csend(83, a.data(), 3, 1, 0);
    csend(84, a.data(), 5, 1, 0);
  } else if (me == 1) {
    char small[10] = {};
    long info[4] = {};
    CHECK(_crecvx(82, small, 10, 0, -1, info) == -1 && errno == EQMSGLONG);
    CHECK(is_payload(small, 9, 10) && infocount() == 100 && infonode() == 0);
    CHECK(info[NX_INFO_TYPE] == 82 && info[NX_INFO_COUNT] == 100 && info[NX_INFO_NODE] == 0);
    CHECK(_crecv(84, small, 10) == 0 && infotype() == 84 && infocount() == 5);
    CHECK(_crecv(83, small, 10) == 0 && infocount() == 3 && is_payload(small, 9, 3));
  }
  CHECK(_csend(1, nullptr, 0, nodes, 0) == -1 && errno == EQNODE);
  CHECK(_csend(-5, nullptr, 0, 0, 0) == -1 && errno == EQTYPE);
  CHECK(_crecv(1, nullptr, -1) == -1 && errno == EQLEN);
  CHECK(_msgwait(999999) == -1 && errno == EQMID);
  CHECK(_msgdone(999999) == -1 && errno == EQMID);
  CHECK(_msgcancel(999999) == -1 && errno == EQMID);
  CHECK(_gdsum(nullptr, 3, nullptr) == -1 && errno == EQPBUF);  // local check: no messages
  CHECK(_iprobex(1, nodes + 3, -1, nullptr) == -1 && errno == EQNODE);
  gsync();
}

void cancel_ignore_sendrecv() {
  char a[8] = {}, b[8] = {};
  if (me == 1) {
    long mid = irecv(90, a, 8);
    msgcancel(mid);  // withdrawn: the message goes to the next receive
    CHECK(_msgwait(mid) == -1 && errno == EQMID);
    long ignored = irecv(91, b, 8);
    msgignore(ignored);  // still receives, nobody waits
  }
  gsync();
  if (me == 0) {
    csend(90, ptr(const_cast<char*>("cancel")), 7, 1, 0);
    csend(91, ptr(const_cast<char*>("ignore")), 7, 1, 0);
  } else if (me == 1) {
    char c[8] = {};
    crecv(90, c, 8);
    CHECK(std::strcmp(c, "cancel") == 0 && a[0] == 0);
    for (double end = dclock() + 10; b[0] == 0 && dclock() < end;) flick();
    CHECK(std::strcmp(b, "ignore") == 0);
  }
  gsync();
  // csendrecv / isendrecv: 0 and 1 swap values.
  if (me <= 1) {
    long mine = me + 100, theirs = 0;
    CHECK(csendrecv(92, ptr(&mine), sizeof mine, 1 - me, 0, 92, ptr(&theirs), sizeof theirs) ==
          sizeof theirs);
    CHECK(theirs == 1 - me + 100);
    long mid = isendrecv(93, ptr(&mine), sizeof mine, 1 - me, 0, 93, ptr(&theirs), sizeof theirs);
    msgwait(mid);
    CHECK(theirs == 1 - me + 100 && infonode() == 1 - me);
  }
  gsync();
}

void environment() {
  CHECK(numnodes() == nodes && mynode() == me);
  CHECK(myptype() == 0);
  setptype(7);
  CHECK(myptype() == 7);
  double t0 = dclock();
  long m0 = mclock();
  usleep(2000);
  CHECK(dclock() > t0 && mclock() >= m0);
  flick();
  // ptype selection: node 0 sends as ptype 7, node 1 selects ptype 7.
  if (me == 0) {
    csend(100, ptr(const_cast<char*>("p")), 2, 1, 7);
  } else if (me == 1) {
    char b[2];
    long info[4];
    crecvx(100, b, 2, 0, 7, info);
    CHECK(info[NX_INFO_PTYPE] == 7 && infoptype() == 7);
  }
  // A node sends to itself.
  long x = 42, y = 0;
  csend(101, ptr(&x), sizeof x, me, 7);
  crecv(101, ptr(&y), sizeof y);
  CHECK(y == 42 && infonode() == me);
  setptype(0);
  gsync();
}

// ---------------------------------------------------------------- collectives

double dvalue(long node, long i) {
  return 1.0 / static_cast<double>(node + 1) + 0.25 * static_cast<double>(i);
}
long lvalue(long node, long i) {
  return (node + 3) * (i + 1) ^ (node << i % 5);
}

long combine_max(char* x, char* y) {
  auto* a = reinterpret_cast<long*>(x);
  auto* b = reinterpret_cast<long*>(y);
  for (int i = 0; i < 3; ++i) a[i] = a[i] > b[i] ? a[i] : b[i];
  return 0;
}

void collectives() {
  const long n = 17;
  double d[n], dw[n];
  float f[n], fw[n];
  long l[n], lw[n];
  auto fill = [&] {
    for (long i = 0; i < n; ++i) {
      d[i] = dvalue(me, i);
      f[i] = static_cast<float>(dvalue(me, i));
      l[i] = lvalue(me, i);
    }
  };
  // Serial answers: every node's contributions combined in node order.
  auto serial_d = [&](long i, int op) {
    double r = dvalue(0, i);
    for (long k = 1; k < nodes; ++k) {
      double v = dvalue(k, i);
      r = op == 0 ? r + v : op == 1 ? r * v : op == 2 ? std::max(r, v) : std::min(r, v);
    }
    return r;
  };
  auto serial_l = [&](long i, int op) {
    long r = lvalue(0, i);
    for (long k = 1; k < nodes; ++k) {
      long v = lvalue(k, i);
      switch (op) {
        case 0:
          r += v;
          break;
        case 1:
          r *= v;
          break;
        case 2:
          r = std::max(r, v);
          break;
        case 3:
          r = std::min(r, v);
          break;
        case 4:
          r &= v;
          break;
        case 5:
          r |= v;
          break;
        case 6:
          r ^= v;
          break;
        case 7:
          r = r && v;
          break;
        case 8:
          r = r || v;
          break;
      }
    }
    return r;
  };
  auto close = [](double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fabs(b) + 1e-12; };
  auto closef = [](float a, double b) { return std::fabs(a - b) <= 1e-4 * std::fabs(b) + 1e-6; };

  void (*dops[])(double*, long, double*) = {gdsum, gdprod, gdhigh, gdlow};
  void (*fops[])(float*, long, float*) = {gssum, gsprod, gshigh, gslow};
  void (*lops[])(long*, long, long*) = {gisum, giprod, gihigh, gilow, giand,
                                        gior,  gixor,  gland,  glor};
  for (int op = 0; op < 4; ++op) {
    fill();
    dops[op](d, n, dw);
    fops[op](f, n, fw);
    for (long i = 0; i < n; ++i)
      CHECK(close(d[i], serial_d(i, op)) && closef(f[i], serial_d(i, op)));
  }
  for (int op = 0; op < 9; ++op) {
    fill();
    if (op == 7) l[3] = me == nodes - 1 ? 0 : l[3];  // one false makes gland false
    lops[op](l, n, lw);
    for (long i = 0; i < n; ++i) {
      long want = serial_l(i, op);
      if (op == 7 && i == 3) want = 0;
      CHECK(l[i] == want);
    }
  }
  gsync();

  long triple[3] = {me, 10 - me, me * me}, work[3];
  gopf(ptr(triple), sizeof triple, ptr(work), combine_max);
  CHECK(triple[0] == nodes - 1 && triple[1] == 10 && triple[2] == (nodes - 1) * (nodes - 1));

  // gcol: node k contributes k+1 bytes of value k.
  std::vector<char> mine(static_cast<std::size_t>(me + 1), static_cast<char>(me)), all(64);
  long total = 0;
  gcol(mine.data(), me + 1, all.data(), 64, &total);
  CHECK(total == nodes * (nodes + 1) / 2);
  for (long k = 0, at = 0; k < nodes; ++k)
    for (long j = 0; j <= k; ++j) CHECK(all[static_cast<std::size_t>(at++)] == k);
  std::vector<long> lens;
  for (long k = 0; k < nodes; ++k) lens.push_back(k + 1);
  std::vector<char> all2(64);
  gcolx(mine.data(), lens.data(), all2.data());
  CHECK(std::memcmp(all.data(), all2.data(), static_cast<std::size_t>(total)) == 0);
  for (int i = 0; i < 50; ++i) gsync();
}

void pingpong() {
  // 20000 round trips between nodes 0 and 1, content checked. Run with all
  // nodes on one CPU, waiters must yield to the peer they wait for: spinning
  // made each one-way cost ~1 ms there (this suite did not end in 30 s).
  for (long i = 0; i < 20000; ++i) {
    long v = i;
    if (me == 0) {
      csend(7, ptr(&v), sizeof v, 1, 0);
      crecv(8, ptr(&v), sizeof v);
      CHECK(v == i + 1);
    } else if (me == 1) {
      crecv(7, ptr(&v), sizeof v);
      CHECK(v == i);
      ++v;
      csend(8, ptr(&v), sizeof v, 0, 0);
    }
  }
}

// ---------------------------------------------------------------- failures

void killed() {
  // Node nodes-1 dies while everyone else waits for it.
  if (me == nodes - 1) {
    usleep(100000);
    ::kill(::getpid(), SIGKILL);
  }
  char b[4];
  crecv(999, b, 4);  // never sent: the job must end instead of hanging
}

void large() {
  // Messages larger than the receiver's ring: the receiver is waiting in
  // crecv, so on the fabric path it posts its buffer once the header is in,
  // and the part the ring did not hold is redirected.
  const long size = 8L << 20;
  std::vector<char> buf(static_cast<std::size_t>(size));
  for (long round = 0; round < 8; ++round) {
    gsync();
    if (me == 0) {
      auto a = payload(round, size);
      // Let node 1 reach crecv first (an unexpected message is buffered by
      // copy: there is no user buffer to post).
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      csend(110, a.data(), size, 1, 0);
    } else if (me == 1) {
      crecv(110, buf.data(), size);
      CHECK(is_payload(buf.data(), round, size));
    }
  }
  gsync();
}

void vanished() {
  // The last node leaves without ending its streams (_exit skips atexit) and
  // with status 0, so the launcher sees nothing wrong: the library itself
  // must report the lost node to whoever waits for it.
  gsync();
  if (me == nodes - 1) _exit(0);
  // Node 1 sends once node 0 had the time to learn of the loss (stretched
  // by the sanitizer builds' time scale: TSan learns it several times later).
  const auto learned = std::chrono::milliseconds(500) * vmmc::test::time_scale();
  if (me == 0) {
    // A receive that failed must not take a later message into its buffer:
    // node 1's message, sent after node 0 gave up, goes to the next receive.
    char first[4] = {'x', 'x', 'x', 'x'}, second[4] = {};
    CHECK(_crecv(777, first, 4) == -1 && errno == EQBADNODE);
    std::this_thread::sleep_for(2 * learned);
    CHECK(_crecv(777, second, 4) == 0 && infocount() == 4);
    CHECK(std::memcmp(second, "abcd", 4) == 0);
    CHECK(std::memcmp(first, "xxxx", 4) == 0);
  } else if (me == 1) {
    std::this_thread::sleep_for(learned);
    CHECK(_csend(777, ptr(const_cast<char*>("abcd")), 4, 0, 0) == 0);
  }
  char b[4];
  CHECK(_crecvx(999, b, 4, nodes - 1, -1, nullptr) == -1 && errno == EQBADNODE);
}

void kill_a_node() {
  // killproc ends node 1; the launcher then ends the job with an error.
  if (me == 0) killproc(1, 0);
  char b[4];
  crecv(998, b, 4);  // never sent
}

void too_long_plain() {
  if (me == 0) csend(5, ptr(const_cast<char*>("too long")), 9, 1, 0);
  if (me == 1) {
    char b[2];
    crecv(5, b, 2);  // the plain form prints the error and terminates
  }
  gsync();
}

// ---------------------------------------------------------------- nodes that end
// A node that ends in order (returns from main, exit) delivers what it sent;
// waits that only it could satisfy fail with EQBADNODE within 1 s, the
// others go on.

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// How long a wait may take to fail once the node it waits for ended.
double ended_bound() {
  return 1.0 * vmmc::test::time_scale();
}

void ended() {
  const long last = nodes - 1;
  const long sizes[] = {0, 64, 4096, 1L << 20};
  gsync();
  if (me == last) {
    // Messages sent just before the end: every one is delivered.
    for (long i = 0; i < 4; ++i) {
      auto a = payload(i, sizes[i]);
      csend(300 + i, a.data(), sizes[i], 0, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return;  // main returns 0: an orderly end
  }
  const auto start = std::chrono::steady_clock::now();
  char b[8];
  if (me == 0) {
    // Waits for node `last` while it ends: fails, not hangs.
    CHECK(_crecvx(310, b, sizeof b, last, -1, nullptr) == -1 && errno == EQBADNODE);
    const double took = seconds_since(start);
    std::printf("node 0: receive from an ended node failed after %.3f s\n", took);
    CHECK(took < 0.3 + ended_bound());
    // What it sent before it ended was delivered, in order.
    std::vector<char> buf(1 << 20);
    for (long i = 0; i < 4; ++i) {
      CHECK(_crecvx(-1, buf.data(), 1 << 20, last, -1, nullptr) == 0);
      CHECK(infotype() == 300 + i && infocount() == sizes[i] &&
            is_payload(buf.data(), i, sizes[i]));
    }
    // A receive posted later fails at once; other nodes still answer.
    CHECK(_crecvx(311, b, sizeof b, last, -1, nullptr) == -1 && errno == EQBADNODE);
    long mid = _irecvx(312, b, sizeof b, last, -1, nullptr);
    CHECK(mid > 0 && _msgwait(mid) == -1 && errno == EQBADNODE);
    if (nodes > 2) {
      csend(320, b, 1, 1, 0);
      crecv(321, b, 1);
    }
  } else if (me == 1) {
    // A blocking probe and an irecv+msgwait on the ended node.
    long mid = irecvx(313, b, sizeof b, last, -1, nullptr);
    CHECK(_cprobex(314, last, -1, nullptr) == -1 && errno == EQBADNODE);
    CHECK(seconds_since(start) < 0.3 + ended_bound());
    CHECK(_msgwait(mid) == -1 && errno == EQBADNODE);
    crecv(320, b, 1);
    csend(321, b, 1, 0, 0);
  }
  // A collective that needs the ended node fails on every node: on those
  // that wait for it, then on those that wait for them, as they end.
  CHECK(_gsync() == -1 && errno == EQBADNODE);
}

void ended_plain() {
  // The last node returns from main while the others enter gsync: the plain
  // form ends the job with a message that names it.
  gsync();
  if (me == nodes - 1) return;
  gsync();
}

void send_then_exit() {
  // Node 0 sends and ends at once (its first NX call is the send, so it
  // also ends before node 1 may have finished starting); node 1 takes the
  // messages later, all of them, then finds nothing more will come.
  const long sizes[] = {8, 64, 1000, 4000, 300000};
  if (me == 0) {
    for (long i = 0; i < 5; ++i) {
      auto a = payload(i + 40, sizes[i]);
      csend(340 + i, a.data(), sizes[i], 1, 0);
    }
    return;
  }
  if (me != 1) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<char> buf(300000);
  for (long i = 0; i < 5; ++i) {
    crecv(340 + i, buf.data(), 300000);
    CHECK(infocount() == sizes[i] && is_payload(buf.data(), i + 40, sizes[i]));
  }
  // Nothing more can come from anyone: a receive from any node fails.
  CHECK(_crecv(-1, buf.data(), 8) == -1 && errno == EQBADNODE);
}

// ---------------------------------------------------------------- handlers at arrival
// The "server by handler" pattern: node 1 serves a counter from an hrecv
// handler; the other nodes ask (type 200, their node number) and wait for
// the answer (type 201). The handler must run when a request arrives: while
// node 1 waits in gsync, and while it computes with no NX call.

constexpr long ask = 200, answer = 201;
long request_in;  // the hrecv buffer
std::atomic<long> served{0};
std::atomic<bool> in_server{false}, overlapped{false};

void serve(long type, long count, long node, long) {
  // Never run concurrently with itself, nor nested (its csend waits).
  if (in_server.exchange(true)) overlapped = true;
  CHECK(type == ask && count == sizeof(long) && node == request_in);
  long value = served.fetch_add(1) + 1;
  csend(answer, ptr(&value), sizeof value, node, 0);
  hrecv(ask, ptr(&request_in), sizeof request_in, serve);  // serve the next one
  in_server = false;
}

// Every node but 1 asks `rounds` times; returns the answers' sum.
long ask_server(long rounds) {
  long sum = 0;
  for (long i = 0; i < rounds; ++i) {
    csend(ask, ptr(&me), sizeof me, 1, 0);
    long value = 0;
    crecv(answer, ptr(&value), sizeof value);
    CHECK(value >= 1);
    sum += value;
  }
  return sum;
}

void handler_server() {
  const long rounds = 50, askers = nodes - 1;
  if (me == 1) hrecv(ask, ptr(&request_in), sizeof request_in, serve);
  gsync();  // the handler is posted before anyone asks

  // 1. Node 1 waits in gsync; the others ask first, then join it.
  if (me != 1) ask_server(rounds);
  gsync();
  if (me == 1) CHECK(served == askers * rounds);
  gsync();

  // 2. Node 1 computes, with no NX call, until it has served everyone.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  if (me == 1) {
    volatile double x = 1;
    while (served < 2 * askers * rounds && std::chrono::steady_clock::now() < give_up)
      for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
    CHECK(served == 2 * askers * rounds);
  } else {
    // Each answer comes when the request arrives, not at a later poll.
    const auto start = std::chrono::steady_clock::now();
    ask_server(rounds);
    const double each = seconds_since(start) / rounds;
    if (me == 0) std::printf("node 0: answered while computing in %.1f us\n", each * 1e6);
    CHECK(each < 0.05 * vmmc::test::time_scale());  // not the thread's 100 ms nap
  }
  gsync();

  // 3. masktrap(1) holds the handler while node 1 computes; masktrap(0)
  //    runs it before it returns.
  if (me == 1) {
    CHECK(masktrap(1) == 0);
    gsync();
    const long before = served;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // node 0 asked meanwhile
    CHECK(served == before);
    CHECK(masktrap(0) == 1);
    CHECK(served == before + 1);
  } else {
    gsync();
    if (me == 0) ask_server(1);
  }
  gsync();
  if (me == 1) CHECK(!overlapped);
}

// ---------------------------------------------------------------- launcher gone

void hang() {
  // A hung job: every node waits in crecv for a message nobody sends, until
  // the test ends the launcher (SIGALRM ends a node the test could not).
  alarm(static_cast<unsigned>(60 * vmmc::test::time_scale()));
  gsync();
  std::printf("nx_cases hang: node %ld pid %d waiting\n", me, static_cast<int>(::getpid()));
  std::fflush(stdout);
  char b[4];
  crecv(999, b, 4);
}

// ---------------------------------------------------------------- faults
// Checksummed streams of messages (tests/support/fault.h) while a node is
// stopped or killed. Nodes learn each other's pids in-band: the faults are
// injected by the job's own nodes, on nodes of the same job.

constexpr long fault_stream_bytes = 16L << 20;

long exchange_pids(long with) {
  long mine = ::getpid(), theirs = 0;
  if (me < with) {
    csend(40, ptr(&mine), sizeof mine, with, 0);
    crecv(41, ptr(&theirs), sizeof theirs);
  } else {
    crecv(40, ptr(&theirs), sizeof theirs);
    csend(41, ptr(&mine), sizeof mine, with, 0);
  }
  return theirs;
}

// Message sizes of one stream: 1 B .. 1 MiB, log-uniform, the same sequence
// on both nodes.
long next_size(std::mt19937_64& rng, long left) {
  long n = 1 + static_cast<long>(rng() % (std::uint64_t{1} << (rng() % 21)));
  return std::min(n, left);
}

// Sends `bytes` of pattern `seed` from `from` to `to` in messages of type
// `type`; the receiver checks each at its stream offset and the sizes.
// `during(sent_or_received)` runs on both sides after every message.
void patterned_stream(long from, long to, long type, std::uint64_t seed, long bytes,
                      const std::function<void(long)>& during) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> buffer(1 << 20);
  vmmc::test::fault::stream_verifier v(seed);
  for (long at = 0; at < bytes;) {
    long n = next_size(rng, bytes - at);
    if (me == from) {
      vmmc::test::fault::fill_pattern(seed, static_cast<std::uint64_t>(at), buffer.data(),
                                      static_cast<std::size_t>(n));
      csend(type, ptr(buffer.data()), n, to, 0);
    } else if (me == to) {
      crecv(type, ptr(buffer.data()), static_cast<long>(buffer.size()));
      CHECK(infocount() == n && infonode() == from);
      if (!v.feed(buffer.data(), static_cast<std::size_t>(n))) {
        std::fprintf(stderr, "node %ld: %s\n", me, v.error().c_str());
        CHECK(v.ok());
      }
    }
    at += n;
    if (during) during(at);
  }
  if (me == to) {
    CHECK(v.verified() == static_cast<std::uint64_t>(bytes));
    std::uint64_t sum = v.checksum();
    csend(type + 1, ptr(&sum), sizeof sum, from, 0);
  } else if (me == from) {
    std::uint64_t sum = 0;
    crecv(type + 1, ptr(&sum), sizeof sum);
    CHECK(sum == vmmc::test::fault::pattern_checksum(seed, static_cast<std::uint64_t>(bytes)));
  }
}

void stopped() {
  // Node 0 stops node 1 for a second (1) while it sends to it: its sends
  // fill node 1's ring and mailbox and wait; (2) while node 1 sends to it,
  // a quarter into the stream. Both streams arrive whole and in order.
  using clock_type = std::chrono::steady_clock;
  if (me > 1) return gsync();
  long peer = exchange_pids(1 - me);
  std::optional<vmmc::test::fault::paused_for> pause;
  auto stop_peer = [&] {
    pause.emplace(static_cast<pid_t>(peer), std::chrono::milliseconds(1000));
    CHECK(pause->ok());
  };
  auto start = clock_type::now();
  if (me == 0) stop_peer();
  patterned_stream(0, 1, 50, 11, fault_stream_bytes, {});
  if (me == 0) {
    CHECK(clock_type::now() - start >= std::chrono::milliseconds(900));
    pause.reset();
  }
  start = clock_type::now();
  patterned_stream(1, 0, 60, 12, fault_stream_bytes, [&](long at) {
    if (me == 0 && !pause && at >= fault_stream_bytes / 4) stop_peer();
  });
  if (me == 0) {
    CHECK(pause.has_value());
    CHECK(clock_type::now() - start >= std::chrono::milliseconds(900));
    pause.reset();
  }
  gsync();
}

void killed_mid_stream() {
  // Node 1 streams to node 0 until node 0, having verified 8 MiB, kills it;
  // node 2 waits for a message from node 1 that never comes. Node 0 then
  // takes what was on its way (verified) and must get EQBADNODE; the
  // launcher ends the job with an error either way, never a hang.
  constexpr std::uint64_t seed = 13;
  constexpr long kill_after = 8L << 20;
  long peer = me <= 1 ? exchange_pids(1 - me) : 0;
  if (me == 1) {
    std::mt19937_64 rng(seed);
    std::vector<unsigned char> buffer(1 << 20);
    for (long at = 0;;) {  // ends when killed
      long n = next_size(rng, 1L << 40);
      vmmc::test::fault::fill_pattern(seed, static_cast<std::uint64_t>(at), buffer.data(),
                                      static_cast<std::size_t>(n));
      csend(70, ptr(buffer.data()), n, 0, 0);
      at += n;
    }
  }
  if (me == 2) {
    char b[4];
    crecv(71, b, 4);  // never sent
    return;
  }
  std::vector<unsigned char> buffer(1 << 20);
  vmmc::test::fault::stream_verifier v(seed);
  bool killed = false;
  for (;;) {
    // _crecv returns 0 on success: the length is infocount().
    long n =
        _crecv(70, ptr(buffer.data()), static_cast<long>(buffer.size())) == 0 ? infocount() : -1;
    if (n < 0) {
      int error = errno;
      std::printf("node 0: errno %d (%s) after %llu verified bytes\n", error,
                  error == EQBADNODE ? "EQBADNODE" : "other",
                  static_cast<unsigned long long>(v.verified()));
      std::fflush(stdout);
      CHECK(killed && error == EQBADNODE);
      std::exit(0);
    }
    if (!v.feed(buffer.data(), static_cast<std::size_t>(n))) {
      std::fprintf(stderr, "node 0: %s\n", v.error().c_str());
      CHECK(v.ok());
    }
    if (!killed && v.verified() >= static_cast<std::uint64_t>(kill_after)) {
      std::printf("node 0: verified %llu bytes; killing node 1\n",
                  static_cast<unsigned long long>(v.verified()));
      std::fflush(stdout);
      CHECK(vmmc::test::fault::kill_peer(static_cast<pid_t>(peer), SIGKILL) == 0);
      killed = true;
    }
  }
}

// ---------------------------------------------------------------- with sockets

// The process's contexts: each listens for same-host peers on one abstract
// Unix socket, "@vmmc.<pid>.<nonce>".
int contexts_of_this_process() {
  FILE* f = std::fopen("/proc/net/unix", "r");
  CHECK(f != nullptr);
  const std::string mine = "@vmmc." + std::to_string(::getpid()) + ".";
  int count = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    // "Num RefCount Protocol Flags Type St Inode Path": listening is flag
    // 00010000 (connections accepted there bear the same name).
    char flags[16] = "";
    const char* path = std::strchr(line, '@');
    if (path && std::strncmp(path, mine.c_str(), mine.size()) == 0 &&
        std::sscanf(line, "%*s %*s %*s %15s", flags) == 1)
      count += std::strcmp(flags, "00010000") == 0;
  }
  std::fclose(f);
  return count;
}

void full_io(int fd, char* p, std::size_t n, bool writing) {
  for (std::size_t done = 0; done < n;) {
    ssize_t k = writing ? ::write(fd, p + done, n - done) : ::read(fd, p + done, n - done);
    CHECK(k > 0 || (k < 0 && errno == EINTR));
    if (k > 0) done += static_cast<std::size_t>(k);
  }
}

// An NX code that also talks TCP, run under the socket interposer
// (libvmmc_preload.so): node 1 streams to node 0 over a loopback connection,
// which is accelerated, and the process runs one context for both layers
// (one control thread, one listener), not one per layer.
void with_sockets() {
  CHECK(nodes == 2);
  CHECK(::dlsym(RTLD_DEFAULT, "vmmc_preload_describe") != nullptr);  // under the interposer
  constexpr std::size_t chunk = 64 << 10, total = 8 << 20;
  std::vector<char> buf(chunk);
  int fd = -1;
  if (me == 0) {
    int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof a;
    CHECK(listener >= 0 && ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    CHECK(::listen(listener, 1) == 0);
    CHECK(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &length) == 0);
    long port = ntohs(a.sin_port);
    csend(40, ptr(&port), sizeof port, 1, 0);
    fd = ::accept(listener, nullptr, nullptr);
    CHECK(fd >= 0);
    ::close(listener);
    for (std::size_t at = 0; at < total; at += chunk) {
      full_io(fd, buf.data(), chunk, false);
      CHECK(is_payload(buf.data(), static_cast<long>(at / chunk), chunk));
      full_io(fd, buf.data(), 1, true);  // the turn: node 1 sends the next chunk
    }
  } else {
    long port = 0;
    crecv(40, ptr(&port), sizeof port);
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    CHECK(fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    for (std::size_t at = 0; at < total; at += chunk) {
      auto bytes = payload(static_cast<long>(at / chunk), chunk);
      full_io(fd, bytes.data(), chunk, true);
      full_io(fd, buf.data(), 1, false);
    }
  }
  const std::string how = vmmc::test::describe_preloaded(fd);
  if (how.find("accelerated=1") == std::string::npos) {
    std::fprintf(stderr, "node %ld: the connection is not accelerated: '%s'\n", me, how.c_str());
    std::exit(3);
  }
  const int contexts = contexts_of_this_process();
  if (contexts != 1) {
    std::fprintf(stderr,
                 "node %ld: %d contexts in this process (NX's and the sockets layer's?), "
                 "want one\n",
                 me, contexts);
    std::exit(3);
  }
  gsync();
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  std::string suite = argc > 1 ? argv[1] : "p2p";
  if (suite == "send_then_exit") {
    // Its first NX call is a send: no start-up call before it.
    me = std::atol(std::getenv("VMMC_NX_RANK") ? std::getenv("VMMC_NX_RANK")
                   : std::getenv("PMIX_RANK")  ? std::getenv("PMIX_RANK")
                                               : "0");
    nodes = 2;
    send_then_exit();
    if (me == 1) std::printf("nx_cases %s: ok\n", suite.c_str());
    return 0;
  }
  me = mynode();
  nodes = numnodes();
  if (suite == "p2p") {
    CHECK(nodes >= 2);
    basic_and_selection();
    node_selection_and_broadcast();
    probes();
    asynchronous();
    many_outstanding();
    fifo_order();
    small_messages_overflow_the_mailbox();
    force_types();
    handlers();
    errors_and_limits();
    cancel_ignore_sendrecv();
    environment();
  } else if (suite == "collectives") {
    collectives();
  } else if (suite == "pingpong") {
    pingpong();
  } else if (suite == "killed") {
    killed();
  } else if (suite == "large") {
    large();
  } else if (suite == "vanished") {
    vanished();
  } else if (suite == "killproc") {
    kill_a_node();
  } else if (suite == "stopped") {
    CHECK(nodes >= 2);
    stopped();
  } else if (suite == "killed_mid_stream") {
    CHECK(nodes == 3);
    killed_mid_stream();
  } else if (suite == "too_long") {
    too_long_plain();
  } else if (suite == "handler_server") {
    CHECK(nodes >= 2);
    handler_server();
  } else if (suite == "hang") {
    hang();
  } else if (suite == "ended") {
    CHECK(nodes >= 2);
    ended();
  } else if (suite == "with_sockets") {
    with_sockets();
  } else if (suite == "ended_plain") {
    ended_plain();
  } else {
    std::fprintf(stderr, "unknown suite %s\n", suite.c_str());
    return 2;
  }
  if (me == 0) std::printf("nx_cases %s: %ld nodes ok\n", suite.c_str(), nodes);
  return 0;
}
