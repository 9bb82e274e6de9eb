/* vmmc/vrpc/vrpc.h: SunRPC over VMMC, as a libtirpc CLIENT and SVCXPRT.
 *
 * A vRPC connection is a TCP connection made through vmmc::sockets: it
 * carries standard RPC record marking (RFC 5531, section 11) and is upgraded
 * in-band to VMMC when both ends speak it, else it stays kernel TCP. So a
 * vRPC server is also an ordinary TCP RPC server (plain libtirpc clients,
 * rpcinfo and rpcbind see a "tcp" transport), and a vRPC client is an
 * ordinary TCP RPC client towards plain servers.
 *
 * Client: clnt_vmmc_create() returns a CLIENT whose clnt_ops behave like
 * libtirpc's clnt_vc (clnt_call timeouts, clnt_control, clnt_geterr, auth
 * flavours through cl_auth, one-way calls with a zero timeout). Errors are
 * reported as clnt_stat values: RPC_CANTSEND / RPC_CANTRECV (with re_errno)
 * when the server or the connection is gone, RPC_TIMEDOUT, RPC_CANTDECODERES,
 * and the server's own verdicts. Creation failures set rpc_createerr and
 * return NULL.
 *
 * Server: svc_vmmc_create() returns a listening SVCXPRT registered with
 * libtirpc (xprt_register on its kernel descriptor). Register programs on it
 * with svc_register()/svc_reg() as for svctcp_create(); an unmodified
 * svc_run() then serves its connections beside any UDP and TCP transports,
 * with the same dispatch functions. Each accepted connection is an SVCXPRT of
 * its own (svc_getcaller/svc_getrpccaller give the peer's address).
 *
 * Thread safety: one CLIENT may be used from several threads (calls are
 * serialised). Server transports follow libtirpc's single-threaded svc_run
 * model: use them from the thread that runs svc_run.
 */
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <netinet/in.h>
#include <rpc/rpc.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A client for (prog, vers) on `host` (a name or dotted IPv4 address). `port`
 * 0 asks the host's rpcbind for the program's TCP port. The client starts
 * with AUTH_NONE in cl_auth; set AUTH_SYS with authunix_create_default() and
 * destroy it yourself, as for libtirpc clients. Returns NULL with
 * rpc_createerr set (RPC_UNKNOWNHOST, RPC_PROGNOTREGISTERED,
 * RPC_SYSTEMERROR with cf_error.re_errno) on failure. */
CLIENT* clnt_vmmc_create(const char* host, rpcprog_t prog, rpcvers_t vers, unsigned short port);

/* The same for a known address (its port must be set). */
CLIENT* clnt_vmmc_create_addr(const struct sockaddr_in* server, rpcprog_t prog, rpcvers_t vers);

/* clnt_vc_create()'s contract on a vRPC connection, for the interposer:
 * `fd` is an unconnected TCP socket the caller made (bound or with options
 * set as it likes); it is connected to `raddr` (IPv4) through vmmc::sockets,
 * so that it is upgraded when the server speaks VMMC and stays kernel TCP
 * otherwise. As with clnt_vc_create, a failed connect sets rpc_createerr
 * (RPC_SYSTEMERROR, errno), the client does not close `fd` unless told
 * CLSET_FD_CLOSE, and clnt_destroy frees non-empty cl_netid/cl_tp strings
 * the caller put there. NULL with rpc_createerr RPC_SYSTEMERROR/EINVAL when
 * `fd` or `raddr` is not of that kind (the caller may then use clnt_vc_create). */
CLIENT* clnt_vmmc_vc_create(int fd, const struct netbuf* raddr, rpcprog_t prog, rpcvers_t vers);

/* A listening server transport bound to `address` (NULL: INADDR_ANY, any
 * port). xp_port is the bound port. Returns NULL and sets errno on failure. */
SVCXPRT* svc_vmmc_create(const struct sockaddr_in* address);

/* How a transport of ours carries its calls: "mapped" or "fabric:<provider>"
 * once upgraded to VMMC, "tcp" while (or when for good) kernel TCP,
 * "listener" for a listening transport. NULL when `xprt`/`client` is not a
 * vRPC one. The string stays valid until the next call on the same object. */
const char* svc_vmmc_path(const SVCXPRT* xprt);
const char* clnt_vmmc_path(const CLIENT* client);

#ifdef __cplusplus
}
#endif

#pragma GCC visibility pop
