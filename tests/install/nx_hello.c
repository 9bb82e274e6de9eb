/* tests/install/nx_hello.c: an NX program built against an installed vmmc
 * (pkg-config vmmc-nx, and nxcc) and run as 2 nodes under the installed
 * nxrun: node 0 sends node 1 a message, node 1 prints what arrived. */
#include <nx.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  char text[64];
  if (numnodes() != 2) {
    fprintf(stderr, "nx_hello: needs 2 nodes, has %ld\n", numnodes());
    return 1;
  }
  if (mynode() == 0) {
    snprintf(text, sizeof text, "hello from node %ld", mynode());
    csend(7, text, (long)strlen(text) + 1, 1, 0);
  } else {
    memset(text, 0, sizeof text);
    crecv(7, text, sizeof text);
    printf("node 1 got type %ld, %ld bytes from node %ld: %s\n", infotype(), infocount(),
           infonode(), text);
  }
  /* Node 0 must not end before node 1 is through start-up: node 1's accept
   * of node 0's channel fails with "peer is gone" when node 0 has already
   * exited (about 1 run in 4 without this; nx/src/runtime.cc, connect). */
  gsync();
  return 0;
}
