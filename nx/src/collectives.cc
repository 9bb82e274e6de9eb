// nx/src/collectives.cc: gsync, the g* reductions, gopf, gcol and gcolx on
// internal point-to-point messages (their own message space, so user
// receives with type -1 never see them; the type is the collective's
// sequence number, the same on every node).
//
// Reductions: recursive doubling when the node count is a power of two
// (log2 N exchanges; a+b == b+a in IEEE arithmetic, so every node ends with
// the same bits), else combine at node 0 in node order and broadcast.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "nx.h"
#include "runtime.h"

namespace {

using vmmc::nx::detail::check_buffer;
using vmmc::nx::detail::checked;
using vmmc::nx::detail::nx_call;
using vmmc::nx::detail::or_die;
using vmmc::nx::detail::request;
using vmmc::nx::detail::runtime;
using vmmc::nx::detail::selector;
using vmmc::nx::detail::space;

int recv_internal(runtime& r, long tag, long from, void* buf, std::size_t bytes,
                  long* count = nullptr) {
  vmmc::nx::detail::info got;
  int e = r.receive({space::internal, tag, from, -1}, buf, static_cast<long>(bytes), nullptr, got);
  if ((e == 0 || e == EQMSGLONG) && count) *count = got.count;
  return e;
}

int send_internal(runtime& r, long tag, long to, const void* buf, std::size_t bytes) {
  return r.send(space::internal, tag, buf, static_cast<long>(bytes), to, nullptr);
}

// Combines `in` into `acc` (`bytes` long).
template <class Combine>
int all_reduce(void* x, std::size_t bytes, Combine combine) {
  nx_call guard;
  runtime& r = runtime::instance();
  const long n = r.nodes(), me = r.node(), tag = r.next_collective();
  if (n == 1) return 0;
  // The partner's contribution: on the stack when small (gdsum of a few values).
  char small[256];
  std::vector<char> large(bytes > sizeof small ? bytes : 0);
  char* other = large.empty() ? small : large.data();
  if ((n & (n - 1)) == 0) {
    for (long bit = 1; bit < n; bit <<= 1) {
      const long partner = me ^ bit;
      // The partner's part finds its receive posted (no arrival buffer);
      // posting takes no progress pass, so ours still leaves at once. The
      // send returns once ours is copied out: waiting drains every channel,
      // so two large sends cannot block each other.
      request* in = nullptr;
      int e = r.post_receive({space::internal, tag, partner, -1}, other, static_cast<long>(bytes),
                             in, nullptr, false);
      if (e) return e;
      const int sent = send_internal(r, tag, partner, x, bytes);
      e = r.await_receive(in, nullptr);  // after a failed send it returns the failure at once
      if (sent) return sent;
      if (e) return e;
      combine(static_cast<char*>(x), other);
    }
    return 0;
  }
  if (me != 0) {
    if (int e = send_internal(r, tag, 0, x, bytes)) return e;
    return recv_internal(r, tag, 0, x, bytes);
  }
  for (long from = 1; from < n; ++from) {
    if (int e = recv_internal(r, tag, from, other, bytes)) return e;
    combine(static_cast<char*>(x), other);
  }
  return send_internal(r, tag, -1, x, bytes);
}

template <class T, class Op>
int reduce(T* x, long count, Op op) {
  if (int e = check_buffer(x, count)) return e;
  return all_reduce(x, sizeof(T) * static_cast<std::size_t>(count), [&](char* acc, char* in) {
    T* a = reinterpret_cast<T*>(acc);
    const T* b = reinterpret_cast<const T*>(in);
    for (long i = 0; i < count; ++i) a[i] = op(a[i], b[i]);
  });
}

// Gathers every node's piece at node 0, in node order, then sends the whole
// to everyone. `lengths` known on every node (gcolx) or learnt (gcol).
int collect(const char* x, long xlen, char* y, long ylen, long* total_out) {
  nx_call guard;
  runtime& r = runtime::instance();
  if (int e = check_buffer(x, xlen)) return e;
  if (int e = check_buffer(y, ylen)) return e;
  const long n = r.nodes(), me = r.node(), tag = r.next_collective();
  if (me != 0) {
    if (int e = send_internal(r, tag, 0, x, static_cast<std::size_t>(xlen))) return e;
    return recv_internal(r, tag, 0, y, static_cast<std::size_t>(ylen), total_out);
  }
  if (xlen > ylen) return EQMSGLONG;
  if (xlen) std::memmove(y, x, static_cast<std::size_t>(xlen));
  long at = xlen;
  for (long from = 1; from < n; ++from) {
    long got = 0;
    int e = recv_internal(r, tag, from, y + at, static_cast<std::size_t>(ylen - at), &got);
    if (e) return e;
    at += got;
  }
  *total_out = at;
  return send_internal(r, tag, -1, y, static_cast<std::size_t>(at));
}

struct sum {
  template <class T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct product {
  template <class T>
  T operator()(T a, T b) const {
    return a * b;
  }
};
struct high {
  template <class T>
  T operator()(T a, T b) const {
    return std::max(a, b);
  }
};
struct low {
  template <class T>
  T operator()(T a, T b) const {
    return std::min(a, b);
  }
};

int sync_all() {
  char none = 0;
  return all_reduce(&none, 0, [](char*, char*) {});
}

int opf(char* x, long xlen, nx_combine f) {
  if (!f) return EQPARAM;
  if (int e = check_buffer(x, xlen)) return e;
  return all_reduce(x, static_cast<std::size_t>(xlen), [f](char* acc, char* in) { f(acc, in); });
}

int colx(char* x, long xlens[], char* y) {
  if (!xlens) return EQPBUF;
  nx_call guard;
  runtime& r = runtime::instance();
  long total = 0;
  for (long i = 0; i < r.nodes(); ++i) total += xlens[i];
  long got = 0;
  return collect(x, xlens[r.node()], y, total, &got);
}

}  // namespace

extern "C" {

// Each reduction in both forms: plain (terminates on error) and underscore.
#define NX_REDUCTION(name, T, op)     \
  void name(T x[], long n, T[]) {     \
    or_die(#name, reduce(x, n, op));  \
  }                                   \
  long _##name(T x[], long n, T[]) {  \
    return checked(reduce(x, n, op)); \
  }
NX_REDUCTION(gdsum, double, sum{})
NX_REDUCTION(gisum, long, sum{})
NX_REDUCTION(gssum, float, sum{})
NX_REDUCTION(gdprod, double, product{})
NX_REDUCTION(giprod, long, product{})
NX_REDUCTION(gsprod, float, product{})
NX_REDUCTION(gdhigh, double, high{})
NX_REDUCTION(gdlow, double, low{})
NX_REDUCTION(gihigh, long, high{})
NX_REDUCTION(gilow, long, low{})
NX_REDUCTION(gshigh, float, high{})
NX_REDUCTION(gslow, float, low{})
NX_REDUCTION(giand, long, [](long a, long b) { return a & b; })
NX_REDUCTION(gior, long, [](long a, long b) { return a | b; })
NX_REDUCTION(gixor, long, [](long a, long b) { return a ^ b; })
NX_REDUCTION(gland, long, [](long a, long b) { return static_cast<long>(a && b); })
NX_REDUCTION(glor, long, [](long a, long b) { return static_cast<long>(a || b); })
#undef NX_REDUCTION

void gsync(void) {
  or_die("gsync", sync_all());
}
long _gsync(void) {
  return checked(sync_all());
}

void gopf(char* x, long xlen, char* work, nx_combine function) {
  (void)work;
  or_die("gopf", opf(x, xlen, function));
}
long _gopf(char* x, long xlen, char*, nx_combine function) {
  return checked(opf(x, xlen, function));
}

void gcol(char* x, long xlen, char* y, long ylen, long* ncnt) {
  long total = 0;
  or_die("gcol", collect(x, xlen, y, ylen, &total));
  if (ncnt) *ncnt = total;
}
long _gcol(char* x, long xlen, char* y, long ylen, long* ncnt) {
  long total = 0;
  long rc = checked(collect(x, xlen, y, ylen, &total));
  if (ncnt) *ncnt = total;
  return rc;
}
void gcolx(char* x, long xlens[], char* y) {
  or_die("gcolx", colx(x, xlens, y));
}
long _gcolx(char* x, long xlens[], char* y) {
  return checked(colx(x, xlens, y));
}

}  // extern "C"
