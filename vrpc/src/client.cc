// The vRPC CLIENT: libtirpc's clnt_ops over a vmmc::sockets connection,
// with the semantics of libtirpc's clnt_vc (see vmmc/vrpc/vrpc.h).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rpc/pmap_clnt.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "vmmc/sockets/socket.h"
#include "vmmc/vrpc/vrpc.h"
#include "vrpc_impl.h"

namespace vmmc::vrpc::detail {
namespace {

struct client {
  explicit client(int descriptor) : fd(descriptor), stream(descriptor) {}

  CLIENT handle{};
  const int fd;
  bool close_fd = true;
  record_stream stream;
  std::mutex mutex;  // one call at a time
  sockaddr_in server{};
  netbuf server_netbuf{};
  rpcprog_t prog = 0;
  rpcvers_t vers = 0;
  std::uint32_t next_xid = 0, last_xid = 0;
  timeval wait{25, 0};
  bool wait_set = false;  // CLSET_TIMEOUT overrides clnt_call's timeout
  int io_timeout_ms = -1;
  rpc_err error{};
  std::string path;
};

client& of(CLIENT* handle) {
  return *static_cast<client*>(handle->cl_private);
}

int milliseconds(const timeval& tv) {
  long long ms = static_cast<long long>(tv.tv_sec) * 1000 + (tv.tv_usec + 999) / 1000;
  return static_cast<int>(std::clamp<long long>(ms, 1, 1 << 30));
}

// A failed send or receive as clnt_vc reports it.
clnt_stat transport_error(client& c, clnt_stat status) {
  const record_stream& s = c.stream;
  if (s.last_failure() == failure::timed_out) {
    c.error.re_status = RPC_TIMEDOUT;
  } else {
    c.error.re_status = status;
    c.error.re_errno = s.error_number()                        ? s.error_number()
                       : s.last_failure() == failure::protocol ? EPROTO
                                                               : ECONNRESET;
  }
  return c.error.re_status;
}

void free_verifier(opaque_auth& verifier) {
  if (verifier.oa_base) free_decoded(as_xdrproc(&xdr_opaque_auth), &verifier);
}

clnt_stat call(CLIENT* handle, rpcproc_t proc, xdrproc_t xdr_args, void* args,
               xdrproc_t xdr_results, void* results, timeval timeout) {
  client& c = of(handle);
  std::lock_guard lock(c.mutex);
  if (!c.wait_set && timeout.tv_sec >= 0 && timeout.tv_usec >= 0) c.wait = timeout;
  const bool one_way = timeout.tv_sec == 0 && timeout.tv_usec == 0;
  if (!one_way || c.io_timeout_ms < 0) {
    int ms = milliseconds(one_way ? timeval{25, 0} : c.wait);
    if (ms != c.io_timeout_ms && set_io_timeout(c.fd, ms)) c.io_timeout_ms = ms;
  }
  int refreshes = 2;

call_again:
  c.error = {};
  c.stream.clear_failure();
  const std::uint32_t xid = c.next_xid++;
  c.last_xid = xid;
  XDR* out = c.stream.encoder();
  rpc_msg call_msg{};
  call_msg.rm_xid = xid;
  call_msg.rm_direction = CALL;
  call_msg.rm_call.cb_rpcvers = RPC_MSG_VERSION;
  call_msg.rm_call.cb_prog = c.prog;
  call_msg.rm_call.cb_vers = c.vers;
  if (!xdr_callhdr(out, &call_msg) || !xdr_u_int32_t(out, &proc) ||
      !AUTH_MARSHALL(handle->cl_auth, out) ||
      !AUTH_WRAP(handle->cl_auth, out, xdr_args, static_cast<caddr_t>(args))) {
    if (c.stream.last_failure() != failure::none) return transport_error(c, RPC_CANTSEND);
    c.error.re_status = RPC_CANTENCODEARGS;
    (void)c.stream.end_record();  // the server rejects what we sent; the stream stays framed
    return c.error.re_status;
  }
  if (!c.stream.end_record()) return transport_error(c, RPC_CANTSEND);
  if (one_way) return c.error.re_status = RPC_TIMEDOUT;

  XDR* in = c.stream.decoder();
  rpc_msg reply{};
  while (true) {
    reply = rpc_msg{};
    reply.acpted_rply.ar_verf = _null_auth;
    reply.acpted_rply.ar_results.where = nullptr;
    reply.acpted_rply.ar_results.proc = as_xdrproc(&xdr_void);
    if (!c.stream.begin_record()) return transport_error(c, RPC_CANTRECV);
    if (xdr_replymsg(in, &reply)) {
      if (reply.rm_xid == xid) break;
      free_verifier(reply.acpted_rply.ar_verf);  // a late reply to an earlier call
      continue;
    }
    free_verifier(reply.acpted_rply.ar_verf);
    failure f = c.stream.last_failure();
    if (f != failure::none && f != failure::short_record) return transport_error(c, RPC_CANTRECV);
    c.stream.clear_failure();  // a garbled record: skip it
  }

  _seterr_reply(&reply, &c.error);
  if (c.error.re_status == RPC_SUCCESS) {
    if (!AUTH_VALIDATE(handle->cl_auth, &reply.acpted_rply.ar_verf)) {
      c.error.re_status = RPC_AUTHERROR;
      c.error.re_why = AUTH_INVALIDRESP;
    } else if (!AUTH_UNWRAP(handle->cl_auth, in, xdr_results, static_cast<caddr_t>(results))) {
      if (c.stream.last_failure() != failure::none &&
          c.stream.last_failure() != failure::short_record)
        return transport_error(c, RPC_CANTRECV);
      c.error.re_status = RPC_CANTDECODERES;
    }
    free_verifier(reply.acpted_rply.ar_verf);
  } else if (refreshes-- > 0 && AUTH_REFRESH(handle->cl_auth, &reply)) {
    goto call_again;
  }
  // The rest of the record (nothing, for a well-formed reply) goes now, so the
  // next call starts on a record boundary.
  c.stream.clear_failure();
  if (!c.stream.skip_record() && c.error.re_status == RPC_SUCCESS)
    return transport_error(c, RPC_CANTRECV);
  return c.error.re_status;
}

void abort_call(CLIENT*) {}

void get_error(CLIENT* handle, rpc_err* error) {
  *error = of(handle).error;
}

bool_t free_results(CLIENT*, xdrproc_t xdr_results, void* results) {
  return free_decoded(xdr_results, results);
}

constexpr const char* own_netid = "tcp";

void destroy(CLIENT* handle) {
  client* c = &of(handle);
  if (c->close_fd) sockets::close(c->fd);
  // Strings clnt_tli_create put there (libtirpc frees them in clnt_vc_destroy).
  if (handle->cl_netid && handle->cl_netid != own_netid && handle->cl_netid[0])
    std::free(handle->cl_netid);
  if (handle->cl_tp && handle->cl_tp[0]) std::free(handle->cl_tp);
  delete c;
}

bool_t control(CLIENT* handle, u_int request, void* info) {
  client& c = of(handle);
  std::lock_guard lock(c.mutex);
  if (request == CLSET_FD_CLOSE || request == CLSET_FD_NCLOSE) {
    c.close_fd = request == CLSET_FD_CLOSE;
    return TRUE;
  }
  if (!info) return FALSE;
  auto& word = *static_cast<std::uint32_t*>(info);
  switch (request) {
    case CLSET_TIMEOUT: {
      auto* tv = static_cast<timeval*>(info);
      if (tv->tv_sec < 0 || tv->tv_usec < 0) return FALSE;
      c.wait = *tv;
      c.wait_set = true;
      return TRUE;
    }
    case CLGET_TIMEOUT:
      *static_cast<timeval*>(info) = c.wait;
      return TRUE;
    case CLGET_SERVER_ADDR:
      std::memcpy(info, &c.server, sizeof c.server);
      return TRUE;
    case CLGET_SVC_ADDR:
      *static_cast<netbuf*>(info) = c.server_netbuf;
      return TRUE;
    case CLGET_FD:
      *static_cast<int*>(info) = c.fd;
      return TRUE;
    case CLGET_XID:
      word = c.last_xid;
      return TRUE;
    case CLSET_XID:
      c.next_xid = word;
      return TRUE;
    case CLGET_VERS:
      word = static_cast<std::uint32_t>(c.vers);
      return TRUE;
    case CLSET_VERS:
      c.vers = word;
      return TRUE;
    case CLGET_PROG:
      word = static_cast<std::uint32_t>(c.prog);
      return TRUE;
    case CLSET_PROG:
      c.prog = word;
      return TRUE;
    default:
      return FALSE;
  }
}

CLIENT::clnt_ops client_ops = {call, abort_call, get_error, free_results, destroy, control};

std::uint32_t first_xid() {
  static std::atomic<std::uint32_t> counter{0};
  auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return static_cast<std::uint32_t>(now) ^ (static_cast<std::uint32_t>(::getpid()) << 16) ^
         (counter.fetch_add(1) << 24);
}

void creation_failed(clnt_stat status, int error_number) {
  rpc_createerr.cf_stat = status;
  rpc_createerr.cf_error.re_status = status;
  rpc_createerr.cf_error.re_errno = error_number;
}

}  // namespace
}  // namespace vmmc::vrpc::detail

using namespace vmmc::vrpc::detail;
namespace sockets = vmmc::sockets;

namespace {
// A client on `fd`, connected to `server`.
CLIENT* make_client(int fd, const sockaddr_in* server, rpcprog_t prog, rpcvers_t vers) {
  int one = 1;
  sockets::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto* c = new client(fd);
  c->server = *server;
  c->server_netbuf = {sizeof c->server, sizeof c->server, &c->server};
  c->prog = prog;
  c->vers = vers;
  c->next_xid = first_xid();
  c->handle.cl_ops = &client_ops;
  c->handle.cl_private = c;
  c->handle.cl_auth = authnone_create();
  c->handle.cl_netid = const_cast<char*>(own_netid);
  return &c->handle;
}
}  // namespace

extern "C" CLIENT* clnt_vmmc_create_addr(const sockaddr_in* server, rpcprog_t prog,
                                         rpcvers_t vers) {
  int fd = sockets::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    creation_failed(RPC_SYSTEMERROR, errno);
    return nullptr;
  }
  if (sockets::connect(fd, reinterpret_cast<const sockaddr*>(server), sizeof *server) != 0) {
    creation_failed(RPC_SYSTEMERROR, errno);
    sockets::close(fd);
    return nullptr;
  }
  return make_client(fd, server, prog, vers);
}

extern "C" CLIENT* clnt_vmmc_vc_create(int fd, const netbuf* raddr, rpcprog_t prog,
                                       rpcvers_t vers) {
  sockaddr_in server{};
  if (!raddr || !raddr->buf || raddr->len != sizeof server ||
      static_cast<const sockaddr*>(raddr->buf)->sa_family != AF_INET ||
      sockets::take_over(fd) != 0) {
    creation_failed(RPC_SYSTEMERROR, EINVAL);
    return nullptr;
  }
  std::memcpy(&server, raddr->buf, sizeof server);
  if (sockets::connect(fd, reinterpret_cast<const sockaddr*>(&server), sizeof server) != 0 &&
      errno != EISCONN) {
    creation_failed(RPC_SYSTEMERROR, errno);
    return nullptr;
  }
  CLIENT* handle = make_client(fd, &server, prog, vers);
  of(handle).close_fd = false;  // the caller's descriptor, as clnt_vc_create
  handle->cl_netid = nullptr;
  return handle;
}

extern "C" CLIENT* clnt_vmmc_create(const char* host, rpcprog_t prog, rpcvers_t vers,
                                    unsigned short port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  if (!host || inet_pton(AF_INET, host, &address.sin_addr) != 1) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (!host || getaddrinfo(host, nullptr, &hints, &found) != 0 || !found) {
      creation_failed(RPC_UNKNOWNHOST, 0);
      return nullptr;
    }
    address.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
    freeaddrinfo(found);
  }
  if (port == 0) {
    port = pmap_getport(&address, prog, vers, IPPROTO_TCP);  // sets rpc_createerr
    if (port == 0) return nullptr;
  }
  address.sin_port = htons(port);
  return clnt_vmmc_create_addr(&address, prog, vers);
}

extern "C" const char* clnt_vmmc_path(const CLIENT* handle) {
  if (!handle || handle->cl_ops != &client_ops) return nullptr;
  client& c = *static_cast<client*>(handle->cl_private);
  c.path = path_of(c.fd);
  return c.path.c_str();
}
