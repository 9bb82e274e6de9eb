/* nx.h: NX (Intel iPSC/Paragon) message passing over VMMC.
 *
 * Existing NX sources compile against this header and link with libvmmc_nx.
 * Nodes are numbered 0..numnodes()-1; start them with `nxrun -n N prog` or
 * under a PMIx launcher (`mpirun -n N prog`, `srun`). A program started
 * alone is one node.
 *
 * Messages: a message has a type (0 .. 2^30-1 for ordinary types; bit 30
 * set makes it a FORCE type), a length in bytes, a sending node and the
 * sender's process type (ptype). Receives select by type (`typesel`: an exact
 * type, or -1 for any non-FORCE type), and in the `x` forms also by node and
 * ptype (-1: any). Messages between one pair of nodes are received in the
 * order they were sent, among those a receive selects. Sending to node -1
 * sends to every other node. A FORCE message that finds no posted receive
 * (irecv/hrecv, or a crecv waiting) when it arrives is discarded.
 *
 * Receiving into a buffer shorter than the message stores the first `count`
 * bytes and fails with EQMSGLONG (msginfo still reports the full length).
 *
 * Errors: every call has a plain form, which prints the error to stderr and
 * terminates the process (exit status 1) as NX did, and an underscore form
 * (_csend, _crecv ...), which returns -1 and sets errno to one of the EQ*
 * codes below (or sets errno and returns -1.0/NULL-like values where noted).
 * Successful underscore calls return 0 unless they return a value (a mid,
 * a flag, csendrecv's length): _crecv/_crecvx return 0, the length is
 * infocount(). A peer node that dies is an error on whatever waits for it
 * (EQBADNODE).
 *
 * msginfo: after crecv/crecvx, cprobe/cprobex, iprobe/iprobex returning 1,
 * msgwait or msgdone returning 1 for a receive, msginfo[] holds the type,
 * count, node and ptype of that message (read them with infotype(),
 * infocount(), infonode(), infoptype()). The `x` forms also fill `info[]`
 * (at least 4 longs) with the same four values.
 *
 * Thread safety: the library is single-threaded like NX; call it from one
 * thread. Handlers of hrecv run inside NX calls of that thread (never
 * concurrently, never nested), unless masked with masktrap(1).
 */
#ifndef VMMC_NX_H
#define VMMC_NX_H

#include <sys/types.h> /* pid_t */

#pragma GCC visibility push(default) /* the library's API */
#ifdef __cplusplus
extern "C" {
#endif

/* NX error codes (errno values of the underscore forms): NX's names and
 * meanings, with the values of the iPSC/2 <errno.h> (150 + n; they collide
 * with no Linux errno). Returned here:
 *   EQPBUF     null buffer with a nonzero length
 *   EQLEN      negative length
 *   EQMSGLONG  message longer than the receive buffer
 *   EQPID      invalid ptype (negative, or a selector below -1)
 *   EQNODE     node number out of range
 *   EQTYPE     invalid type or type selector
 *   EQMID      unknown or already released message id
 *   EQHND      no handler given to hrecv/hsend
 *   EQNOPROC   no process slot: nx_nfork (one process per node, fixed at start)
 *   EQPARAM    invalid parameter (nx_initve: a size other than the job's)
 *   EQMEM      out of memory
 *   EQBADNODE  node not responding: a node died or its link broke
 *   EQDRVERR   the transport failed otherwise
 * Defined for NX sources that name them, never returned here: EQBLEN (no
 * system buffer quota), EQTIME, EQUSEPID, EQSET, EQNOSET (ptypes need no
 * setting up: every node has ptype 0 until setptype), EQNOMID (message ids
 * are not limited). */
#define EQDRVERR 150  /* internal driver error (the transport failed) */
#define EQPBUF 151    /* invalid buffer pointer */
#define EQBLEN 152    /* buffer length exceeds allocation */
#define EQLEN 153     /* invalid length */
#define EQTIME 154    /* time limit exceeded */
#define EQMSGLONG 155 /* received message too long for buffer */
#define EQPID 156     /* invalid pid (ptype) */
#define EQNODE 157    /* invalid node */
#define EQTYPE 158    /* invalid type */
#define EQMID 159     /* invalid message id */
#define EQHND 160     /* invalid handler */
#define EQNOPROC 161  /* out of process slots */
#define EQUSEPID 162  /* pid (ptype) already in use */
#define EQPARAM 165   /* invalid parameter */
#define EQMEM 171     /* not enough memory */
#define EQNOMID 174   /* too many requests */
#define EQSET 175     /* pid (ptype) already set */
#define EQNOSET 176   /* no pid (ptype) defined */
#define EQBADNODE 199 /* node not responding */
/* This library's earlier names. */
#define EQNODEGONE EQBADNODE
#define EQNOMEM EQMEM
#define EQFAIL EQDRVERR

#define NX_FORCE_TYPE 0x40000000L /* bit 30: FORCE type */
#define FORCE_TYPE NX_FORCE_TYPE  /* Paragon's name */
#define INVALID_PTYPE (-1L)
#define HWHZ 10000000L /* hwclock ticks per second */
#define HOST myhost()

/* hwclock's 64-bit tick count, in two halves (Paragon's PFS type). */
#ifndef _ESIZE_T
#define _ESIZE_T
typedef struct s_size {
  long slow;  /* low 32 bits */
  long shigh; /* high 32 bits */
} esize_t;
#endif
/* nx_app_nodes' list of node numbers (malloc'ed; the caller frees it). */
typedef long* nx_nodes_t;

/* Indices into msginfo[] and info[]. */
#define NX_INFO_TYPE 0
#define NX_INFO_COUNT 1
#define NX_INFO_NODE 2
#define NX_INFO_PTYPE 3
extern long msginfo[8];

typedef void (*nx_handler)(long type, long count, long node, long ptype);
typedef void (*nx_handlerx)(long type, long count, long node, long ptype, long hparam);
/* gopf: combine `y` into `x` (both `xlen` bytes); must be associative and
 * commutative. The return value is ignored. */
typedef long (*nx_combine)(char* x, char* y);

/* ---- point to point: blocking -------------------------------------- */
void csend(long type, char* buf, long count, long node, long ptype);
void crecv(long typesel, char* buf, long count);
void crecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]);
/* Sends, then receives; returns the received length. */
long csendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
               long rcount);

/* ---- point to point: asynchronous (return a message id, mid) -------- */
long isend(long type, char* buf, long count, long node, long ptype);
long irecv(long typesel, char* buf, long count);
long irecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]);
long isendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
               long rcount);
void msgwait(long mid);   /* waits and releases the mid */
long msgdone(long mid);   /* 1 (mid released) when finished, else 0 */
void msgcancel(long mid); /* withdraws a receive not yet matched / a send not yet started */
void msgignore(long mid); /* releases the mid; the operation goes on */

/* ---- probes ------------------------------------------------------- */
void cprobe(long typesel);
void cprobex(long typesel, long nodesel, long ptypesel, long info[]);
long iprobe(long typesel); /* 1 if a selected message has arrived, else 0 */
long iprobex(long typesel, long nodesel, long ptypesel, long info[]);

/* ---- message information (of the last receive/probe, see above) ---- */
long infocount(void);
long infonode(void);
long infotype(void);
long infoptype(void);

/* ---- handler receives ---------------------------------------------- */
/* Posts a receive; when the message is in `buf`, `handler` runs with its
 * type, count, node and ptype. Returns a mid (which msgwait may not wait on:
 * the handler owns completion; msgcancel withdraws it while unmatched). */
long hrecv(long typesel, char* buf, long count, nx_handler handler);
long hrecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, nx_handlerx handler,
            long hparam);
/* 1 masks handlers (they wait), 0 unmasks and runs the waiting ones.
 * Returns the previous state. */
long masktrap(long state);

/* ---- environment --------------------------------------------------- */
long mynode(void);
long numnodes(void);
long myptype(void);
void setptype(long ptype);
double dclock(void); /* seconds, monotonic */
long mclock(void);   /* milliseconds, monotonic */
void flick(void);    /* yields the processor (and runs handlers) */
/* Terminates node `node` (-1: every other node); ptype is ignored. */
void killproc(long node, long ptype);

/* ---- added for old codes (issue 18) -------------------------------- */
/* Makes mid1 stand for both operations (mid1 -1: mid2 alone); msgwait,
 * msgdone, msgcancel and msgignore on it act on all of them. Returns it. */
long msgmerge(long mid1, long mid2);
/* Sends; when `buf` may be reused, `handler` runs (as hrecv's do) with the
 * message's type, count, node and ptype. No mid: the handler owns it. */
void hsend(long type, char* buf, long count, long node, long ptype, nx_handler handler);
void hsendx(long type, char* buf, long count, long node, long ptype, nx_handlerx handler,
            long hparam);
/* Sends, and posts a handler receive for the reply (typesel into rbuf). */
void hsendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
               long rcount, nx_handler handler);
/* Sends the message to each of nodes[0..nodecount-1]. */
void gsendx(long type, char* buf, long count, long nodes[], long nodecount);
/* Discards the selected messages that have arrived (not those to come). */
void flushmsg(long typesel, long nodesel, long ptypesel);
/* Prints `s: ` and the text of errno (NX codes included) to stderr. */
void nx_perror(const char* s);

/* Process management. The launcher made the job: nx_initve joins it and
 * returns numnodes() (size 0, or the job's size; another size fails with
 * EQPARAM); partition, account, argc and argv are not used. nx_nfork fails
 * with EQNOPROC (one process per node, fixed at start). nx_app_nodes (app 0
 * or getpid(): this job) gives the node numbers 0..N-1; nx_app_rect and
 * mypart give 1 row of numnodes() columns. These return -1 and set errno. */
long nx_initve(char* partition, long size, char* account, int* argc, char** argv);
long nx_initve_rect(char* partition, long anchor, long rows, long cols, char* account, int* argc,
                    char** argv);
long nx_nfork(long node_list[], long list_size, long ptype, long pid_list[]);
long nx_app_nodes(pid_t app, nx_nodes_t* node_list, unsigned long* list_size);
long nx_app_rect(long* rows, long* cols);
long mypart(long* rows, long* cols);
/* There is no host (controlling) process: myhost() is numnodes(), a node
 * number no node has, so sends to it fail with EQNODE. */
long myhost(void);
/* iPSC: the process id is the ptype; nodedim is log2 numnodes() rounded up;
 * gray/ginv the binary-reflected Gray code and its inverse; killcube is
 * killproc. */
long mypid(void);
long infopid(void);
long nodedim(void);
long gray(long i);
long ginv(long g);
void killcube(long node, long pid);
/* The front-panel LED: there is none; the call does nothing. */
void led(long state);
/* The time in HWHZ (10 MHz) ticks, monotonic. */
void hwclock(esize_t* time);

/* ---- collectives (every node calls them in the same order) -------- */
void gsync(void);
void gdsum(double x[], long n, double work[]);
void gisum(long x[], long n, long work[]);
void gssum(float x[], long n, float work[]);
void gdprod(double x[], long n, double work[]);
void giprod(long x[], long n, long work[]);
void gsprod(float x[], long n, float work[]);
void gdhigh(double x[], long n, double work[]);
void gdlow(double x[], long n, double work[]);
void gihigh(long x[], long n, long work[]);
void gilow(long x[], long n, long work[]);
void gshigh(float x[], long n, float work[]);
void gslow(float x[], long n, float work[]);
void giand(long x[], long n, long work[]);
void gior(long x[], long n, long work[]);
void gixor(long x[], long n, long work[]);
void gland(long x[], long n, long work[]);
void glor(long x[], long n, long work[]);
void gopf(char* x, long xlen, char* work, nx_combine function);
/* Concatenates every node's x (in node order) into y (ylen bytes); *ncnt
 * gets the total length. */
void gcol(char* x, long xlen, char* y, long ylen, long* ncnt);
/* Like gcol with every node's length known: xlens[i] is node i's length. */
void gcolx(char* x, long xlens[], char* y);

/* ---- underscore forms: -1 and errno instead of terminating -------- */
long _csend(long type, char* buf, long count, long node, long ptype);
long _crecv(long typesel, char* buf, long count);
long _crecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]);
long _csendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
                long rcount);
long _isend(long type, char* buf, long count, long node, long ptype);
long _irecv(long typesel, char* buf, long count);
long _irecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, long info[]);
long _isendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
                long rcount);
long _msgwait(long mid);
long _msgdone(long mid);
long _msgcancel(long mid);
long _msgignore(long mid);
long _cprobe(long typesel);
long _cprobex(long typesel, long nodesel, long ptypesel, long info[]);
long _iprobe(long typesel);
long _iprobex(long typesel, long nodesel, long ptypesel, long info[]);
long _hrecv(long typesel, char* buf, long count, nx_handler handler);
long _hrecvx(long typesel, char* buf, long count, long nodesel, long ptypesel, nx_handlerx handler,
             long hparam);
long _setptype(long ptype);
long _killproc(long node, long ptype);
long _gsync(void);
long _gdsum(double x[], long n, double work[]);
long _gisum(long x[], long n, long work[]);
long _gssum(float x[], long n, float work[]);
long _gdprod(double x[], long n, double work[]);
long _giprod(long x[], long n, long work[]);
long _gsprod(float x[], long n, float work[]);
long _gdhigh(double x[], long n, double work[]);
long _gdlow(double x[], long n, double work[]);
long _gihigh(long x[], long n, long work[]);
long _gilow(long x[], long n, long work[]);
long _gshigh(float x[], long n, float work[]);
long _gslow(float x[], long n, float work[]);
long _giand(long x[], long n, long work[]);
long _gior(long x[], long n, long work[]);
long _gixor(long x[], long n, long work[]);
long _gland(long x[], long n, long work[]);
long _glor(long x[], long n, long work[]);
long _gopf(char* x, long xlen, char* work, nx_combine function);
long _gcol(char* x, long xlen, char* y, long ylen, long* ncnt);
long _gcolx(char* x, long xlens[], char* y);
long _msgmerge(long mid1, long mid2);
long _hsend(long type, char* buf, long count, long node, long ptype, nx_handler handler);
long _hsendx(long type, char* buf, long count, long node, long ptype, nx_handlerx handler,
             long hparam);
long _hsendrecv(long type, char* sbuf, long scount, long node, long ptype, long typesel, char* rbuf,
                long rcount, nx_handler handler);
long _gsendx(long type, char* buf, long count, long nodes[], long nodecount);
long _flushmsg(long typesel, long nodesel, long ptypesel);
long _hwclock(esize_t* time);
long _led(long state);
long _killcube(long node, long pid);
/* These cannot fail once the node has started; they return what the plain
 * form returns. */
long _mynode(void);
long _numnodes(void);
long _myptype(void);
long _myhost(void);
long _infocount(void);
long _infonode(void);
long _infotype(void);
long _infoptype(void);
long _infopid(void);
long _masktrap(long state);
long _flick(void);
long _mclock(void);
double _dclock(void);
long _nodedim(void);
long _gray(long i);
long _ginv(long g);

#ifdef __cplusplus
}
#endif

#pragma GCC visibility pop

#endif /* VMMC_NX_H */
