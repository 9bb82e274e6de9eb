/* tests/install/consumer/vrpc_hello.c: a C program built against an installed
 * vmmc::vrpc, whose header includes libtirpc's <rpc/rpc.h> (found through
 * the package's dependency): opens a vRPC listening transport on loopback. */
#include <arpa/inet.h>
#include <stdio.h>

#include "vmmc/vrpc/vrpc.h"

int main(void) {
  struct sockaddr_in address = {0};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  SVCXPRT* listener = svc_vmmc_create(&address);
  if (!listener) {
    perror("svc_vmmc_create");
    return 1;
  }
  printf("vrpc %s, port %s\n", svc_vmmc_path(listener), listener->xp_port ? "bound" : "none");
  svc_destroy(listener);
  return 0;
}
