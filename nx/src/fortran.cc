// nx/src/fortran.cc: the Fortran entry points of <nx.h> (include 'fnx.h').
//
// Fortran passes every argument by reference, and its default INTEGER and
// LOGICAL are 4 bytes where NX's C calls take long: each entry point is a
// thin wrapper that dereferences, narrows or widens, and calls the C form
// (the one implementation). Names follow gfortran: lowercase with a trailing
// underscore, in libvmmc_nx itself. libvmmc_nx_fortran_plain is the same
// library with the Fortran names without the underscore (gfortran
// -fno-underscoring, and compilers that never add one); there the C calls
// are renamed (src/fortran_rename.h, generated from this file's NX_FORTRAN
// lines) so that the Fortran csend is not the C csend: a program links the
// one library or the other.
//
// Only the plain forms exist (a Fortran name cannot begin with `_`), which
// end the program on an error. Not here: nx_app_nodes (it returns a malloc'ed
// C array) and msginfo (read it with infotype() ... infoptype()).
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "nx.h"
#include "runtime.h"

namespace {

// `pending` is shared with handlers, which may run on the handler thread.
using guard = vmmc::nx::detail::nx_call;

using f_int = std::int32_t;  // INTEGER, LOGICAL
using f_handler = void (*)(const f_int*, const f_int*, const f_int*, const f_int*);
using f_handlerx = void (*)(const f_int*, const f_int*, const f_int*, const f_int*, const f_int*);

// Runs f on a long copy of x[0..n-1] (INTEGER arrays for the long C calls)
// and stores the result back.
template <class F>
void on_longs(f_int* x, f_int n, F f) {
  std::vector<long> wide(x, x + std::max<f_int>(n, 0));
  f(wide.data(), static_cast<long>(n));
  std::transform(wide.begin(), wide.end(), x, [](long v) { return static_cast<f_int>(v); });
}

void store_info(const long* from, f_int* to) {
  if (to)
    for (int i = 0; i < 4; ++i) to[i] = static_cast<f_int>(from[i]);
}

// irecvx's info(*) is written when the message arrives, as longs: into a
// buffer kept here, copied to the program's INTEGER array by the msgwait or
// msgdone that sees it filled (a message id of a merged group included).
struct pending_info {
  long values[8];
  f_int* to;
};
std::unordered_map<long, pending_info*> pending;

void deliver_infos() {
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->second->values[NX_INFO_TYPE] == LONG_MIN) {
      ++it;
      continue;
    }
    store_info(it->second->values, it->second->to);
    delete it->second;
    it = pending.erase(it);
  }
}

// A Fortran handler behind a C handlerx: hparam points at this (freed after
// the call; a handler receive cancelled before its message leaks it).
struct fortran_handler {
  f_handler plain;
  f_handlerx extended;
  f_int hparam;
};
void call_fortran_handler(long type, long count, long node, long ptype, long hparam) {
  auto* h = reinterpret_cast<fortran_handler*>(hparam);
  const f_int t = static_cast<f_int>(type), c = static_cast<f_int>(count),
              n = static_cast<f_int>(node), p = static_cast<f_int>(ptype);
  if (h->extended)
    h->extended(&t, &c, &n, &p, &h->hparam);
  else
    h->plain(&t, &c, &n, &p);
  delete h;
}
long to_hparam(f_handler plain, f_handlerx extended, f_int hparam) {
  return reinterpret_cast<long>(new fortran_handler{plain, extended, hparam});
}

}  // namespace

#ifdef VMMC_NX_FORTRAN_PLAIN_NAMES
#define NX_FORTRAN_SUFFIX ""
#else
#define NX_FORTRAN_SUFFIX "_"
#endif
// Declares Fortran entry point `name`: the C++ function fortran_<name>
// under the Fortran symbol, exported (fnx.h, Fortran, cannot say so). `#`
// and `##` keep `name` from being renamed.
#define NX_FORTRAN_AS(ret, function, symbol, params)                                               \
  extern "C" [[gnu::visibility("default")]] ret function params __asm__(symbol NX_FORTRAN_SUFFIX); \
  extern "C" ret function params
#define NX_FORTRAN(ret, name, params) NX_FORTRAN_AS(ret, fortran_##name, #name, params)

using in = const f_int*;  // an INTEGER argument

// ---------------------------------------------------------------- point to point
NX_FORTRAN(void, csend, (in type, char* buf, in count, in node, in ptype)) {
  csend(*type, buf, *count, *node, *ptype);
}
NX_FORTRAN(void, crecv, (in typesel, char* buf, in count)) {
  crecv(*typesel, buf, *count);
}
NX_FORTRAN(void, crecvx, (in typesel, char* buf, in count, in nodesel, in ptypesel, f_int* info)) {
  long got[8];
  crecvx(*typesel, buf, *count, *nodesel, *ptypesel, got);
  store_info(got, info);
}
NX_FORTRAN(f_int, csendrecv,
           (in type, char* sbuf, in scount, in node, in ptype, in typesel, char* rbuf, in rcount)) {
  return static_cast<f_int>(
      csendrecv(*type, sbuf, *scount, *node, *ptype, *typesel, rbuf, *rcount));
}
NX_FORTRAN(f_int, isend, (in type, char* buf, in count, in node, in ptype)) {
  return static_cast<f_int>(isend(*type, buf, *count, *node, *ptype));
}
NX_FORTRAN(f_int, irecv, (in typesel, char* buf, in count)) {
  return static_cast<f_int>(irecv(*typesel, buf, *count));
}
NX_FORTRAN(f_int, irecvx, (in typesel, char* buf, in count, in nodesel, in ptypesel, f_int* info)) {
  guard held;
  auto* p = new pending_info{{LONG_MIN}, info};
  long mid = irecvx(*typesel, buf, *count, *nodesel, *ptypesel, p->values);
  pending.emplace(mid, p);
  return static_cast<f_int>(mid);
}
NX_FORTRAN(f_int, isendrecv,
           (in type, char* sbuf, in scount, in node, in ptype, in typesel, char* rbuf, in rcount)) {
  return static_cast<f_int>(
      isendrecv(*type, sbuf, *scount, *node, *ptype, *typesel, rbuf, *rcount));
}
NX_FORTRAN(void, msgwait, (in mid)) {
  guard held;
  msgwait(*mid);
  deliver_infos();
}
NX_FORTRAN(f_int, msgdone, (in mid)) {
  guard held;
  long done = msgdone(*mid);
  if (done) deliver_infos();
  return static_cast<f_int>(done);
}
NX_FORTRAN(void, msgcancel, (in mid)) {
  msgcancel(*mid);
}
NX_FORTRAN(void, msgignore, (in mid)) {
  msgignore(*mid);
}
NX_FORTRAN(f_int, msgmerge, (in mid1, in mid2)) {
  return static_cast<f_int>(msgmerge(*mid1, *mid2));
}
NX_FORTRAN(void, gsendx, (in type, char* buf, in count, f_int* nodes, in nodecount)) {
  on_longs(nodes, *nodecount, [&](long* list, long n) { gsendx(*type, buf, *count, list, n); });
}
NX_FORTRAN(void, flushmsg, (in typesel, in nodesel, in ptypesel)) {
  flushmsg(*typesel, *nodesel, *ptypesel);
}

// ---------------------------------------------------------------- probes, info
NX_FORTRAN(void, cprobe, (in typesel)) {
  cprobe(*typesel);
}
NX_FORTRAN(void, cprobex, (in typesel, in nodesel, in ptypesel, f_int* info)) {
  long got[8];
  cprobex(*typesel, *nodesel, *ptypesel, got);
  store_info(got, info);
}
NX_FORTRAN(f_int, iprobe, (in typesel)) {
  return static_cast<f_int>(iprobe(*typesel));
}
NX_FORTRAN(f_int, iprobex, (in typesel, in nodesel, in ptypesel, f_int* info)) {
  long got[8];
  long found = iprobex(*typesel, *nodesel, *ptypesel, got);
  if (found) store_info(got, info);
  return static_cast<f_int>(found);
}
NX_FORTRAN(f_int, infocount, ()) {
  return static_cast<f_int>(infocount());
}
NX_FORTRAN(f_int, infonode, ()) {
  return static_cast<f_int>(infonode());
}
NX_FORTRAN(f_int, infotype, ()) {
  return static_cast<f_int>(infotype());
}
NX_FORTRAN(f_int, infoptype, ()) {
  return static_cast<f_int>(infoptype());
}
NX_FORTRAN(f_int, infopid, ()) {
  return static_cast<f_int>(infopid());
}

// ---------------------------------------------------------------- handlers
NX_FORTRAN(f_int, hrecv, (in typesel, char* buf, in count, f_handler handler)) {
  return static_cast<f_int>(
      hrecvx(*typesel, buf, *count, -1, -1, call_fortran_handler, to_hparam(handler, nullptr, 0)));
}
NX_FORTRAN(f_int, hrecvx,
           (in typesel, char* buf, in count, in nodesel, in ptypesel, f_handlerx handler,
            in hparam)) {
  return static_cast<f_int>(hrecvx(*typesel, buf, *count, *nodesel, *ptypesel, call_fortran_handler,
                                   to_hparam(nullptr, handler, *hparam)));
}
NX_FORTRAN(void, hsend, (in type, char* buf, in count, in node, in ptype, f_handler handler)) {
  hsendx(*type, buf, *count, *node, *ptype, call_fortran_handler, to_hparam(handler, nullptr, 0));
}
NX_FORTRAN(void, hsendx,
           (in type, char* buf, in count, in node, in ptype, f_handlerx handler, in hparam)) {
  hsendx(*type, buf, *count, *node, *ptype, call_fortran_handler,
         to_hparam(nullptr, handler, *hparam));
}
NX_FORTRAN(void, hsendrecv,
           (in type, char* sbuf, in scount, in node, in ptype, in typesel, char* rbuf, in rcount,
            f_handler handler)) {
  // hsendrecv's C handler takes no parameter to carry the Fortran one: the
  // same two steps, with hrecvx.
  hrecvx(*typesel, rbuf, *rcount, -1, -1, call_fortran_handler, to_hparam(handler, nullptr, 0));
  csend(*type, sbuf, *scount, *node, *ptype);
}
NX_FORTRAN(f_int, masktrap, (in state)) {
  return static_cast<f_int>(masktrap(*state));
}

// ---------------------------------------------------------------- environment
NX_FORTRAN(f_int, mynode, ()) {
  return static_cast<f_int>(mynode());
}
NX_FORTRAN(f_int, numnodes, ()) {
  return static_cast<f_int>(numnodes());
}
NX_FORTRAN(f_int, myptype, ()) {
  return static_cast<f_int>(myptype());
}
NX_FORTRAN(f_int, mypid, ()) {
  return static_cast<f_int>(mypid());
}
NX_FORTRAN(f_int, myhost, ()) {
  return static_cast<f_int>(myhost());
}
NX_FORTRAN(void, setptype, (in ptype)) {
  setptype(*ptype);
}
NX_FORTRAN(double, dclock, ()) {
  return dclock();
}
NX_FORTRAN(f_int, mclock, ()) {
  return static_cast<f_int>(mclock());
}
NX_FORTRAN(void, hwclock, (f_int * time)) {
  esize_t t;
  hwclock(&t);
  time[0] = static_cast<f_int>(t.slow);
  time[1] = static_cast<f_int>(t.shigh);
}
NX_FORTRAN(void, flick, ()) {
  flick();
}
NX_FORTRAN(void, killproc, (in node, in ptype)) {
  killproc(*node, *ptype);
}
NX_FORTRAN(void, killcube, (in node, in pid)) {
  killcube(*node, *pid);
}
NX_FORTRAN(void, led, (in state)) {
  led(*state);
}
NX_FORTRAN(f_int, nodedim, ()) {
  return static_cast<f_int>(nodedim());
}
NX_FORTRAN(f_int, gray, (in i)) {
  return static_cast<f_int>(gray(*i));
}
NX_FORTRAN(f_int, ginv, (in g)) {
  return static_cast<f_int>(ginv(*g));
}
NX_FORTRAN(f_int, nx_app_rect, (f_int * rows, f_int* cols)) {
  long r = 0, k = 0;
  long e = nx_app_rect(&r, &k);
  *rows = static_cast<f_int>(r);
  *cols = static_cast<f_int>(k);
  return static_cast<f_int>(e);
}
NX_FORTRAN(f_int, mypart, (f_int * rows, f_int* cols)) {
  return fortran_nx_app_rect(rows, cols);
}
// CHARACTER arguments: their lengths come after the others (not needed).
NX_FORTRAN(f_int, nx_initve, (const char* partition, in size, const char* account)) {
  (void)partition, (void)account;
  return static_cast<f_int>(nx_initve(nullptr, *size, nullptr, nullptr, nullptr));
}
NX_FORTRAN(f_int, nx_initve_rect,
           (const char* partition, in anchor, in rows, in cols, const char* account)) {
  (void)partition, (void)account;
  return static_cast<f_int>(
      nx_initve_rect(nullptr, *anchor, *rows, *cols, nullptr, nullptr, nullptr));
}
NX_FORTRAN(f_int, nx_nfork, (f_int * node_list, in list_size, in ptype, f_int* pid_list)) {
  (void)node_list, (void)pid_list;
  return static_cast<f_int>(nx_nfork(nullptr, *list_size, *ptype, nullptr));
}
NX_FORTRAN(void, nx_perror, (const char* s, std::size_t length)) {
  nx_perror(std::string(s, length).c_str());
}

// ---------------------------------------------------------------- collectives
NX_FORTRAN(void, gsync, ()) {
  gsync();
}
#define NX_FORTRAN_REAL(name, T)                                        \
  NX_FORTRAN_AS(void, fortran_##name, #name, (T * x, in n, T * work)) { \
    name(x, *n, work);                                                  \
  }
NX_FORTRAN_REAL(gdsum, double)
NX_FORTRAN_REAL(gdprod, double)
NX_FORTRAN_REAL(gdhigh, double)
NX_FORTRAN_REAL(gdlow, double)
NX_FORTRAN_REAL(gssum, float)
NX_FORTRAN_REAL(gsprod, float)
NX_FORTRAN_REAL(gshigh, float)
NX_FORTRAN_REAL(gslow, float)
#undef NX_FORTRAN_REAL
#define NX_FORTRAN_INTEGER(name)                                          \
  NX_FORTRAN_AS(void, fortran_##name, #name, (f_int * x, in n, f_int*)) { \
    on_longs(x, *n, [](long* wide, long k) { name(wide, k, nullptr); });  \
  }
NX_FORTRAN_INTEGER(gisum)
NX_FORTRAN_INTEGER(giprod)
NX_FORTRAN_INTEGER(gihigh)
NX_FORTRAN_INTEGER(gilow)
NX_FORTRAN_INTEGER(giand)
NX_FORTRAN_INTEGER(gior)
NX_FORTRAN_INTEGER(gixor)
NX_FORTRAN_INTEGER(gland)
NX_FORTRAN_INTEGER(glor)
#undef NX_FORTRAN_INTEGER
// f is an INTEGER FUNCTION f(x, y) combining y into x, like the C one.
NX_FORTRAN(void, gopf, (char* x, in xlen, char* work, nx_combine f)) {
  gopf(x, *xlen, work, f);
}
NX_FORTRAN(void, gcol, (char* x, in xlen, char* y, in ylen, f_int* ncnt)) {
  long total = 0;
  gcol(x, *xlen, y, *ylen, &total);
  *ncnt = static_cast<f_int>(total);
}
NX_FORTRAN(void, gcolx, (char* x, f_int* xlens, char* y)) {
  on_longs(xlens, static_cast<f_int>(numnodes()), [&](long* lens, long) { gcolx(x, lens, y); });
}
