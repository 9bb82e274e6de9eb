// nx/src/api.cc: the C API of <nx.h> on the runtime: argument checks,
// msginfo, and NX's two error conventions (plain forms terminate, underscore
// forms return -1 with errno).
#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "nx.h"
#include "runtime.h"

long msginfo[8];

namespace {

using vmmc::nx::detail::checked;
using vmmc::nx::detail::info;
using vmmc::nx::detail::nx_call;
using vmmc::nx::detail::or_die;
using vmmc::nx::detail::request;
using vmmc::nx::detail::runtime;
using vmmc::nx::detail::selector;
using vmmc::nx::detail::space;

runtime& rt() {
  return runtime::instance();
}

void set_msginfo(const info& m) {
  m.store(msginfo);
}

// The operations, each returning an NX code; results through out-parameters.

int do_send(long type, char* buf, long count, long node, long ptype_unused, long* mid) {
  nx_call guard;
  (void)ptype_unused;  // one process per node: the ptype addresses nothing more
  runtime& r = rt();
  request* req = nullptr;
  int e = r.send(space::user, type, buf, count, node, mid ? &req : nullptr);
  if (mid && !e) *mid = req->mid;
  r.run_handlers();
  return e;
}

int post(long typesel, char* buf, long count, long nodesel, long ptypesel, long* info_out,
         request*& req, const request* how = nullptr, bool tracked = true) {
  request extras;
  if (how) extras = *how;
  extras.user_info = info_out;
  return rt().post_receive({space::user, typesel, nodesel, ptypesel}, buf, count, req, &extras,
                           tracked);
}

// A receive's end as the C calls report it: msginfo (and the length) when
// the message arrived, whole or cut to the buffer; then due handlers run.
int report_receive(int e, const info& got, long* count_out) {
  if (e == 0 || e == EQMSGLONG) {
    set_msginfo(got);
    if (count_out) *count_out = got.count;
  }
  rt().run_handlers();
  return e;
}

// Waits for a posted receive and releases it.
int finish_receive(request* req, long* count_out = nullptr) {
  info got;
  return report_receive(rt().await_receive(req, &got), got, count_out);
}

int do_recv(long typesel, char* buf, long count, long nodesel, long ptypesel, long* info_out) {
  nx_call guard;
  info got;
  int e = rt().receive({space::user, typesel, nodesel, ptypesel}, buf, count, info_out, got);
  return report_receive(e, got, nullptr);
}

int do_irecv(long typesel, char* buf, long count, long nodesel, long ptypesel, long* info_out,
             long* mid) {
  nx_call guard;
  request* req;
  if (int e = post(typesel, buf, count, nodesel, ptypesel, info_out, req)) return e;
  *mid = req->mid;
  rt().run_handlers();
  return 0;
}

int do_sendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
                long rcount, long* out) {
  nx_call guard;
  request* req;
  if (int e = post(typesel, rbuf, rcount, -1, -1, nullptr, req, nullptr, false)) return e;
  if (int e = rt().send(space::user, type, sbuf, scount, node, nullptr)) {
    rt().release(req);
    (void)ptype;
    return e;
  }
  return finish_receive(req, out);
}

int do_isendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel,
                 char* rbuf, long rcount, long* mid) {
  nx_call guard;
  // The receive's mid stands for the pair: the send is finished (or queued
  // and tracked by the runtime) before the reply can be waited for.
  request* req;
  if (int e = post(typesel, rbuf, rcount, -1, -1, nullptr, req)) return e;
  request* sent = nullptr;
  if (int e = rt().send(space::user, type, sbuf, scount, node, &sent)) return e;
  (void)ptype;
  rt().release(sent);
  *mid = req->mid;
  return 0;
}

// msgmerge: a mid that stands for others too (its members, in merge order).
std::unordered_map<long, std::vector<long>> merged;

// The mid and its members, taken out of `merged`.
std::vector<long> take_group(long mid) {
  std::vector<long> group{mid};
  if (auto it = merged.find(mid); it != merged.end()) {
    group.insert(group.end(), it->second.begin(), it->second.end());
    merged.erase(it);
  }
  return group;
}

// A mid msgwait/msgdone may wait on (not a handler's).
request* waitable(long mid) {
  request* req = rt().find(mid);
  return req && !req->handler && !req->handlerx ? req : nullptr;
}

int do_msgwait(long mid) {
  nx_call guard;
  runtime& r = rt();
  if (!waitable(mid)) return EQMID;
  int first = 0;
  for (long m : take_group(mid)) {
    request* req = r.find(m);
    int e = EQMID;
    if (req && !req->is_send) {
      e = finish_receive(req);
    } else if (req) {
      e = r.wait(req);
      r.release(req);
      r.run_handlers();
    }
    if (!first) first = e;
  }
  return first;
}

int do_msgdone(long mid, long* done) {
  nx_call guard;
  runtime& r = rt();
  if (!waitable(mid)) return EQMID;
  r.progress();
  r.run_handlers();
  auto group = merged.find(mid);
  bool all = waitable(mid)->done;
  if (group != merged.end())
    for (long m : group->second) {
      const request* member = r.find(m);  // none: released on its own, nothing to wait for
      all = all && (!member || member->done);
    }
  *done = all ? 1 : 0;
  if (!all) {
    ::sched_yield();  // callers spin on msgdone; let the sender run
    return 0;
  }
  int first = 0;
  for (long m : take_group(mid)) {
    request* req = r.find(m);
    if (!req) continue;
    if (!req->is_send) set_msginfo(req->got);
    if (!first) first = req->error;
    r.release(req);
  }
  return first;
}

int do_msgcancel(long mid) {
  nx_call guard;
  runtime& r = rt();
  if (!r.find(mid)) return EQMID;
  for (long m : take_group(mid)) {
    request* req = r.find(m);
    if (!req) continue;
    if (!r.cancel(req)) (void)r.wait(req);  // too late to withdraw: let it finish
    r.release(req);
  }
  return 0;
}

int do_msgignore(long mid) {
  nx_call guard;
  runtime& r = rt();
  if (!r.find(mid)) return EQMID;
  for (long m : take_group(mid))
    if (request* req = r.find(m)) r.release(req);
  return 0;
}

// Paragon's msgmerge: mid1 then stands for both (-1 for mid1: mid2 alone).
int do_msgmerge(long mid1, long mid2, long* out) {
  nx_call guard;
  if (!waitable(mid2) || (mid1 != -1 && !waitable(mid1))) return EQMID;
  if (mid1 == -1 || mid1 == mid2) {
    *out = mid2;
    return 0;
  }
  std::vector<long> joining = take_group(mid2);
  std::vector<long>& group = merged[mid1];
  group.insert(group.end(), joining.begin(), joining.end());
  *out = mid1;
  return 0;
}

int do_probe(long typesel, long nodesel, long ptypesel, long* info_out, bool block,
             long* found_out) {
  nx_call guard;
  bool found = false;
  info m;
  int e = rt().probe({space::user, typesel, nodesel, ptypesel}, block, found, m);
  if (found) {
    set_msginfo(m);
    m.store(info_out);
  }
  if (found_out) *found_out = found ? 1 : 0;
  rt().run_handlers();
  return e;
}

int do_hrecv(long typesel, char* buf, long count, long nodesel, long ptypesel, nx_handler h,
             nx_handlerx hx, long hparam, long* mid) {
  nx_call guard;
  if (!h && !hx) return EQHND;
  request how;
  how.handler = h;
  how.handlerx = hx;
  how.hparam = hparam;
  request* req;
  if (int e = post(typesel, buf, count, nodesel, ptypesel, nullptr, req, &how)) return e;
  *mid = req->mid;
  rt().run_handlers();
  return 0;
}

// hsend/hsendx: sends; the handler runs with the sent message's type,
// count, node and ptype once the buffer may be reused.
int do_hsend(long type, char* buf, long count, long node, nx_handler h, nx_handlerx hx,
             long hparam) {
  nx_call guard;
  if (!h && !hx) return EQHND;
  runtime& r = rt();
  request* req = nullptr;
  if (int e = r.send(space::user, type, buf, count, node, &req)) return e;
  request how;
  how.handler = h;
  how.handlerx = hx;
  how.hparam = hparam;
  r.notify_sent(req, how, {type, count, node, r.ptype});
  r.run_handlers();
  return 0;
}

// hsendrecv: sends, and the handler runs when the reply is in rbuf.
int do_hsendrecv(long type, char* sbuf, long scount, long node, long typesel, char* rbuf,
                 long rcount, nx_handler h) {
  nx_call guard;
  long mid = 0;
  if (int e = do_hrecv(typesel, rbuf, rcount, -1, -1, h, nullptr, 0, &mid)) return e;
  if (int e = rt().send(space::user, type, sbuf, scount, node, nullptr)) {
    (void)do_msgcancel(mid);
    return e;
  }
  rt().run_handlers();
  return 0;
}

// gsendx: one message to each node of a list.
int do_gsendx(long type, char* buf, long count, const long nodes[], long nodecount) {
  nx_call guard;
  if (nodecount < 0 || (nodecount > 0 && !nodes)) return EQPARAM;
  for (long i = 0; i < nodecount; ++i)
    if (nodes[i] < 0 || nodes[i] >= rt().nodes()) return EQNODE;
  for (long i = 0; i < nodecount; ++i)
    if (int e = do_send(type, buf, count, nodes[i], 0, nullptr)) return e;
  return 0;
}

// flushmsg: discards the selected messages that have arrived (msginfo and
// info[] are left alone).
int do_flushmsg(long typesel, long nodesel, long ptypesel) {
  nx_call guard;
  const selector sel{space::user, typesel, nodesel, ptypesel};
  for (;;) {
    bool found = false;
    info m;
    if (int e = rt().probe(sel, false, found, m)) return e;
    if (!found) return 0;
    int e = rt().receive(sel, nullptr, 0, nullptr, m);  // the payload goes nowhere
    if (e && e != EQMSGLONG) return e;
  }
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- point to point

void csend(long type, char* buf, long count, long node, long ptype) {
  or_die("csend", do_send(type, buf, count, node, ptype, nullptr));
}
long _csend(long type, char* buf, long count, long node, long ptype) {
  return checked(do_send(type, buf, count, node, ptype, nullptr));
}
void crecv(long typesel, char* buf, long count) {
  or_die("crecv", do_recv(typesel, buf, count, -1, -1, nullptr));
}
// Success returns 0 (README says why); the length is infocount().
long _crecv(long typesel, char* buf, long count) {
  return checked(do_recv(typesel, buf, count, -1, -1, nullptr));
}
void crecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]) {
  or_die("crecvx", do_recv(typesel, buf, count, nodesel, ptypesel, info));
}
long _crecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]) {
  return checked(do_recv(typesel, buf, count, nodesel, ptypesel, info));
}
long csendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
               long rcount) {
  long n = 0;
  int e = do_sendrecv(type, sbuf, scount, node, ptype, typesel, rbuf, rcount, &n);
  return or_die("csendrecv", e, n);
}
long _csendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
                long rcount) {
  long n = 0;
  int e = do_sendrecv(type, sbuf, scount, node, ptype, typesel, rbuf, rcount, &n);
  return checked(e, n);
}

long isend(long type, char* buf, long count, long node, long ptype) {
  long mid = -1;
  int e = do_send(type, buf, count, node, ptype, &mid);
  return or_die("isend", e, mid);
}
long _isend(long type, char* buf, long count, long node, long ptype) {
  long mid = -1;
  int e = do_send(type, buf, count, node, ptype, &mid);
  return checked(e, mid);
}
long irecv(long typesel, char* buf, long count) {
  long mid = -1;
  int e = do_irecv(typesel, buf, count, -1, -1, nullptr, &mid);
  return or_die("irecv", e, mid);
}
long _irecv(long typesel, char* buf, long count) {
  long mid = -1;
  int e = do_irecv(typesel, buf, count, -1, -1, nullptr, &mid);
  return checked(e, mid);
}
long irecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]) {
  long mid = -1;
  int e = do_irecv(typesel, buf, count, nodesel, ptypesel, info, &mid);
  return or_die("irecvx", e, mid);
}
long _irecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]) {
  long mid = -1;
  int e = do_irecv(typesel, buf, count, nodesel, ptypesel, info, &mid);
  return checked(e, mid);
}
long isendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
               long rcount) {
  long mid = -1;
  int e = do_isendrecv(type, sbuf, scount, node, ptype, typesel, rbuf, rcount, &mid);
  return or_die("isendrecv", e, mid);
}
long _isendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
                long rcount) {
  long mid = -1;
  int e = do_isendrecv(type, sbuf, scount, node, ptype, typesel, rbuf, rcount, &mid);
  return checked(e, mid);
}

void msgwait(long mid) {
  or_die("msgwait", do_msgwait(mid));
}
long _msgwait(long mid) {
  return checked(do_msgwait(mid));
}
long msgdone(long mid) {
  long done = 0;
  int e = do_msgdone(mid, &done);
  return or_die("msgdone", e, done);
}
long _msgdone(long mid) {
  long done = 0;
  int e = do_msgdone(mid, &done);
  return checked(e, done);
}
void msgcancel(long mid) {
  or_die("msgcancel", do_msgcancel(mid));
}
long _msgcancel(long mid) {
  return checked(do_msgcancel(mid));
}
void msgignore(long mid) {
  or_die("msgignore", do_msgignore(mid));
}
long _msgignore(long mid) {
  return checked(do_msgignore(mid));
}

// ---------------------------------------------------------------- probes, info

void cprobe(long typesel) {
  or_die("cprobe", do_probe(typesel, -1, -1, nullptr, true, nullptr));
}
long _cprobe(long typesel) {
  return checked(do_probe(typesel, -1, -1, nullptr, true, nullptr));
}
void cprobex(long typesel, long nodesel, long ptypesel, long info[]) {
  or_die("cprobex", do_probe(typesel, nodesel, ptypesel, info, true, nullptr));
}
long _cprobex(long typesel, long nodesel, long ptypesel, long info[]) {
  return checked(do_probe(typesel, nodesel, ptypesel, info, true, nullptr));
}
long iprobe(long typesel) {
  long found = 0;
  int e = do_probe(typesel, -1, -1, nullptr, false, &found);
  return or_die("iprobe", e, found);
}
long _iprobe(long typesel) {
  long found = 0;
  int e = do_probe(typesel, -1, -1, nullptr, false, &found);
  return checked(e, found);
}
long iprobex(long typesel, long nodesel, long ptypesel, long info[]) {
  long found = 0;
  int e = do_probe(typesel, nodesel, ptypesel, info, false, &found);
  return or_die("iprobex", e, found);
}
long _iprobex(long typesel, long nodesel, long ptypesel, long info[]) {
  long found = 0;
  int e = do_probe(typesel, nodesel, ptypesel, info, false, &found);
  return checked(e, found);
}

long infocount(void) {
  nx_call guard;  // a handler thread's receives change it for a while
  return msginfo[NX_INFO_COUNT];
}
long infonode(void) {
  nx_call guard;  // a handler thread's receives change it for a while
  return msginfo[NX_INFO_NODE];
}
long infotype(void) {
  nx_call guard;  // a handler thread's receives change it for a while
  return msginfo[NX_INFO_TYPE];
}
long infoptype(void) {
  nx_call guard;  // a handler thread's receives change it for a while
  return msginfo[NX_INFO_PTYPE];
}

// ---------------------------------------------------------------- handlers

long hrecv(long typesel, char* buf, long count, nx_handler handler) {
  long mid = -1;
  int e = do_hrecv(typesel, buf, count, -1, -1, handler, nullptr, 0, &mid);
  return or_die("hrecv", e, mid);
}
long _hrecv(long typesel, char* buf, long count, nx_handler handler) {
  long mid = -1;
  int e = do_hrecv(typesel, buf, count, -1, -1, handler, nullptr, 0, &mid);
  return checked(e, mid);
}
long hrecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, nx_handlerx handler,
            long hparam) {
  long mid = -1;
  int e = do_hrecv(typesel, buf, count, nodesel, ptypesel, nullptr, handler, hparam, &mid);
  return or_die("hrecvx", e, mid);
}
long _hrecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, nx_handlerx handler,
             long hparam) {
  long mid = -1;
  int e = do_hrecv(typesel, buf, count, nodesel, ptypesel, nullptr, handler, hparam, &mid);
  return checked(e, mid);
}
long masktrap(long state) {
  nx_call guard;
  return rt().mask(state);
}

// ---------------------------------------------------------------- environment

long mynode(void) {
  return rt().node();
}
long numnodes(void) {
  return rt().nodes();
}
long myptype(void) {
  return rt().ptype;
}
void setptype(long ptype) {
  or_die("setptype", static_cast<int>(_setptype(ptype) ? errno : 0));
}
long _setptype(long ptype) {
  if (ptype < 0) return checked(EQPID);
  nx_call guard;
  rt().ptype = ptype;
  return 0;
}
double dclock(void) {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
long mclock(void) {
  using namespace std::chrono;
  return static_cast<long>(
      duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count());
}
void flick(void) {
  nx_call guard;
  runtime& r = rt();
  r.progress();
  r.run_handlers();
  ::sched_yield();
}
void killproc(long node, long ptype) {
  or_die("killproc", static_cast<int>(_killproc(node, ptype) ? errno : 0));
}
long _killproc(long node, long ptype) {
  (void)ptype;
  nx_call guard;
  return checked(rt().kill_node(node));
}

// ---------------------------------------------------------------- added for old codes

long msgmerge(long mid1, long mid2) {
  long mid = -1;
  int e = do_msgmerge(mid1, mid2, &mid);
  return or_die("msgmerge", e, mid);
}
long _msgmerge(long mid1, long mid2) {
  long mid = -1;
  int e = do_msgmerge(mid1, mid2, &mid);
  return checked(e, mid);
}
void hsend(long type, char* buf, long count, long node, long ptype, nx_handler handler) {
  (void)ptype;
  or_die("hsend", do_hsend(type, buf, count, node, handler, nullptr, 0));
}
long _hsend(long type, char* buf, long count, long node, long ptype, nx_handler handler) {
  (void)ptype;
  return checked(do_hsend(type, buf, count, node, handler, nullptr, 0));
}
void hsendx(long type, char* buf, long count, long node, long ptype, nx_handlerx handler,
            long hparam) {
  (void)ptype;
  or_die("hsendx", do_hsend(type, buf, count, node, nullptr, handler, hparam));
}
long _hsendx(long type, char* buf, long count, long node, long ptype, nx_handlerx handler,
             long hparam) {
  (void)ptype;
  return checked(do_hsend(type, buf, count, node, nullptr, handler, hparam));
}
void hsendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
               long rcount, nx_handler handler) {
  (void)ptype;
  or_die("hsendrecv", do_hsendrecv(type, sbuf, scount, node, typesel, rbuf, rcount, handler));
}
long _hsendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
                long rcount, nx_handler handler) {
  (void)ptype;
  return checked(do_hsendrecv(type, sbuf, scount, node, typesel, rbuf, rcount, handler));
}
void gsendx(long type, char* buf, long count, long nodes[], long nodecount) {
  or_die("gsendx", do_gsendx(type, buf, count, nodes, nodecount));
}
long _gsendx(long type, char* buf, long count, long nodes[], long nodecount) {
  return checked(do_gsendx(type, buf, count, nodes, nodecount));
}
void flushmsg(long typesel, long nodesel, long ptypesel) {
  or_die("flushmsg", do_flushmsg(typesel, nodesel, ptypesel));
}
long _flushmsg(long typesel, long nodesel, long ptypesel) {
  return checked(do_flushmsg(typesel, nodesel, ptypesel));
}
void nx_perror(const char* s) {
  const int e = errno;
  const char* text =
      e >= EQDRVERR && e <= EQBADNODE ? vmmc::nx::detail::describe(e) : std::strerror(e);
  if (s && *s)
    std::fprintf(stderr, "%s: %s\n", s, text);
  else
    std::fprintf(stderr, "%s\n", text);
}

// Underscore forms of the calls that cannot fail once the node has started
// (a node that cannot start exits, as in every call).
long _mynode(void) {
  return mynode();
}
long _numnodes(void) {
  return numnodes();
}
long _myptype(void) {
  return myptype();
}
long _infocount(void) {
  return infocount();
}
long _infonode(void) {
  return infonode();
}
long _infotype(void) {
  return infotype();
}
long _infoptype(void) {
  return infoptype();
}
long _masktrap(long state) {
  return masktrap(state);
}
long _flick(void) {
  flick();
  return 0;
}
double _dclock(void) {
  return dclock();
}
long _mclock(void) {
  return mclock();
}

// iPSC names: the process id is the ptype.
long mypid(void) {
  return myptype();
}
long infopid(void) {
  return infoptype();
}
long _infopid(void) {
  return infoptype();
}
void killcube(long node, long pid) {
  killproc(node, pid);
}
long _killcube(long node, long pid) {
  return _killproc(node, pid);
}

}  // extern "C"
