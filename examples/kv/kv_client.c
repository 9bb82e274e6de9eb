/* examples/kv/kv_client.c: a client of the key-value service (kv.x), built
 * only against libtirpc and rpcgen's stubs: it knows nothing of VMMC.
 *
 *   vmmc-kv-client HOST NETTYPE put KEY VALUE | get KEY | delete KEY |
 *                  transport | bench N SIZE
 *
 * Run it under LD_PRELOAD=libvrpc_preload.so and clnt_create(..., "tcp")
 * returns a vRPC client when the server speaks VMMC ("transport" then prints
 * the server's view of the connection, e.g. "mapped"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: %s HOST NETTYPE put K V | get K | delete K | transport | bench N SIZE\n",
            argv[0]);
    return 2;
  }
  CLIENT* client = clnt_create(argv[1], KV_PROG, KV_VERS, argv[2]);
  if (!client) {
    clnt_pcreateerror(argv[1]);
    return 1;
  }
  const char* command = argv[3];
  int status = 0;
  if (strcmp(command, "put") == 0 && argc == 6) {
    kv_put_args args = {argv[4], {(u_int)strlen(argv[5]), argv[5]}};
    int* ok = kv_put_1(&args, client);
    if (!ok) clnt_perror(client, "put"), status = 1;
  } else if (strcmp(command, "get") == 0 && argc == 5) {
    kv_get_result* r = kv_get_1(&argv[4], client);
    if (!r) {
      clnt_perror(client, "get"), status = 1;
    } else if (!r->found) {
      printf("(not found)\n");
      status = 3;
    } else {
      printf("%.*s\n", (int)r->kv_get_result_u.value.kv_value_len,
             r->kv_get_result_u.value.kv_value_val);
    }
  } else if (strcmp(command, "delete") == 0 && argc == 5) {
    int* ok = kv_delete_1(&argv[4], client);
    if (!ok)
      clnt_perror(client, "delete"), status = 1;
    else
      printf("%s\n", *ok ? "deleted" : "(not found)");
  } else if (strcmp(command, "transport") == 0) {
    char** path = kv_transport_1(NULL, client);
    if (!path)
      clnt_perror(client, "transport"), status = 1;
    else
      printf("%s\n", *path);
  } else if (strcmp(command, "bench") == 0 && argc == 6) {
    /* N puts of SIZE-byte values, then the mean round trip. */
    long n = atol(argv[4]);
    size_t size = (size_t)atol(argv[5]);
    char* value = calloc(1, size + 1);
    kv_put_args args = {"bench", {(u_int)size, value}};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n && status == 0; ++i)
      if (!kv_put_1(&args, client)) clnt_perror(client, "put"), status = 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3;
    char** path = status == 0 ? kv_transport_1(NULL, client) : NULL;
    printf("%ld puts of %zu bytes: %.2f us each, over %s\n", n, size, us / (double)n,
           path ? *path : "?");
    free(value);
  } else {
    fprintf(stderr, "unknown command\n");
    status = 2;
  }
  clnt_destroy(client);
  return status;
}
