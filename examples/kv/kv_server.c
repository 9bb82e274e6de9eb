/* examples/kv/kv_server.c: the key-value service (kv.x) over UDP and vRPC.
 *
 *   vmmc-kv-server [-p] [bind-address]   (default 127.0.0.1)
 *
 * -p serves TCP with libtirpc's own transport instead (a plain server, for
 * comparisons and to show that upgraded clients fall back to TCP).
 *
 * The procedures are what rpcgen asks for (kv_*_1_svc); the dispatch function
 * kv_prog_1 is rpcgen's, unmodified. The vRPC transport is registered with
 * rpcbind as the program's TCP transport: plain TCP clients and rpcinfo see
 * an ordinary TCP service, vRPC clients (or rpcgen clients run under
 * libvrpc_preload.so) reach it over VMMC. Serves until killed. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv.h"
#include "vmmc/vrpc/vrpc.h"

/* rpcgen -m: the dispatch function, in kv_svc.c. */
void kv_prog_1(struct svc_req* request, SVCXPRT* transp);

struct entry {
  struct entry* next;
  char* key;
  kv_value value;
};
static struct entry* entries;

static struct entry** find(const char* key) {
  struct entry** e = &entries;
  while (*e && strcmp((*e)->key, key) != 0) e = &(*e)->next;
  return e;
}

static void drop(struct entry** slot) {
  struct entry* e = *slot;
  *slot = e->next;
  free(e->key);
  free(e->value.kv_value_val);
  free(e);
}

int* kv_put_1_svc(kv_put_args* args, struct svc_req* request) {
  static int result;
  (void)request;
  struct entry** slot = find(args->key);
  if (*slot) drop(slot);
  struct entry* e = calloc(1, sizeof *e);
  e->key = strdup(args->key);
  e->value = args->value; /* taken over: the arguments' buffer becomes ours */
  args->value.kv_value_val = NULL;
  args->value.kv_value_len = 0;
  e->next = entries;
  entries = e;
  result = 1;
  return &result;
}

kv_get_result* kv_get_1_svc(kv_key* key, struct svc_req* request) {
  static kv_get_result result;
  (void)request;
  struct entry* e = *find(*key);
  result.found = e != NULL;
  if (e) result.kv_get_result_u.value = e->value;
  return &result;
}

int* kv_delete_1_svc(kv_key* key, struct svc_req* request) {
  static int result;
  (void)request;
  struct entry** slot = find(*key);
  result = *slot != NULL;
  if (*slot) drop(slot);
  return &result;
}

char** kv_transport_1_svc(void* unused, struct svc_req* request) {
  static char* result;
  (void)unused;
  const char* path = svc_vmmc_path(request->rq_xprt);
  result = (char*)(path ? path : request->rq_xprt->xp_netid ? request->rq_xprt->xp_netid : "?");
  return &result;
}

/* rpcgen's dispatch frees results through this; ours are static or owned. */
int kv_prog_1_freeresult(SVCXPRT* transp, xdrproc_t xdr_result, caddr_t result) {
  (void)transp, (void)xdr_result, (void)result;
  return 1;
}

static SVCXPRT* plain_tcp(const struct sockaddr_in* address) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || bind(fd, (const struct sockaddr*)address, sizeof *address) != 0 ||
      listen(fd, SOMAXCONN) != 0)
    return NULL;
  return svctcp_create(fd, 0, 0);
}

int main(int argc, char** argv) {
  int plain = argc > 1 && strcmp(argv[1], "-p") == 0;
  const char* bind_to = argc > 1 + plain ? argv[1 + plain] : "127.0.0.1";
  struct sockaddr_in address;
  memset(&address, 0, sizeof address);
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, bind_to, &address.sin_addr) != 1) {
    fprintf(stderr, "usage: %s [-p] [bind-address]\n", argv[0]);
    return 2;
  }
  int udp_socket = socket(AF_INET, SOCK_DGRAM, 0);
  if (udp_socket < 0 || bind(udp_socket, (struct sockaddr*)&address, sizeof address) != 0) {
    perror("udp socket");
    return 1;
  }
  SVCXPRT* udp = svcudp_create(udp_socket);
  SVCXPRT* vmmc = plain ? plain_tcp(&address) : svc_vmmc_create(&address);
  if (!udp || !vmmc) {
    fprintf(stderr, "cannot create the transports\n");
    return 1;
  }
  pmap_unset(KV_PROG, KV_VERS);
  if (!svc_register(udp, KV_PROG, KV_VERS, kv_prog_1, IPPROTO_UDP) ||
      !svc_register(vmmc, KV_PROG, KV_VERS, kv_prog_1, IPPROTO_TCP)) {
    fprintf(stderr, "cannot register with rpcbind (is it running?)\n");
    return 1;
  }
  printf("kv: udp port %u, %s port %u\n", udp->xp_port, plain ? "tcp" : "vrpc/tcp", vmmc->xp_port);
  fflush(stdout);
  svc_run();
  return 1;
}
