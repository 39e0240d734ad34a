/*
 * zeppelin.h: the public C API of Zeppelin, a communication library for
 * training large models on batches of variable-length sequences.
 *
 * Conventions follow NCCL: every call returns a zpResult_t, communicators are
 * created from a zpUniqueId shared out of band, point-to-point calls can be
 * grouped with zpGroupStart / zpGroupEnd, and every data call takes a stream.
 *
 * Streams. A CUDA stream (including cudaStreamLegacy and cudaStreamPerThread)
 * means device buffers, with NCCL's semantics: the call checks its arguments,
 * enqueues its work on the stream and returns; the buffers may be reused once
 * the stream has passed that point; a failure that happens later is reported
 * by zpCommGetAsyncError. A NULL stream means host buffers and synchronous
 * completion: the call returns when this rank's part of the operation is
 * finished and its buffers may be reused. That is the one place where
 * Zeppelin differs from NCCL (where NULL is the default stream). A device
 * buffer with a NULL stream, or a host buffer with a stream, is
 * zpInvalidArgument. Device buffers need a build with CUDA and a GPU on every
 * rank (ZP_CUDA_DEVICE picks it); the counts of zpAlltoallv stay host arrays.
 * A call with a stream checks its own arguments and enqueues, without waiting
 * on its peers (zpCheckLocal, the default, as in NCCL); with
 * ZP_CHECK_MODE=full (zpConfig_t.checkMode) it first compares its arguments
 * with every peer's on the host, as host calls always do, so that a mismatch
 * is zpInvalidUsage on every rank instead of a hang or garbage on the device.
 *
 * CUDA graphs. Calls with a stream may be captured (cudaStreamBeginCapture)
 * and replayed, as NCCL's may: what they do on the host (checks, the count
 * exchange) happens once, at capture, so counts, displacements and plans are
 * those of the capture at every launch. Every rank launches its graph as
 * often, and in the same order with its other calls, as it would make the
 * calls; the communicator outlives the graphs. docs/device.md says more.
 *
 * This header compiles as C99 and as C++.
 *
 * Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
 */
#ifndef ZEPPELIN_H_
#define ZEPPELIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every function declared here is exported from the shared library, which
 * hides everything else. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define ZP_MAJOR 0
#define ZP_MINOR 1
#define ZP_PATCH 0
#define ZP_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define ZP_VERSION_CODE ZP_VERSION(ZP_MAJOR, ZP_MINOR, ZP_PATCH)

/* Result codes: the same meanings and values as NCCL's. */
typedef enum {
  zpSuccess = 0,
  zpUnhandledCudaError = 1, /* a CUDA call failed */
  zpSystemError = 2,        /* a system call failed (socket, shm, ...) */
  zpInternalError = 3,      /* a bug in Zeppelin */
  zpInvalidArgument = 4,    /* a bad argument: NULL pointer, bad count, bad peer, ... */
  zpInvalidUsage = 5,       /* arguments fine, but the ranks disagree or the call order is wrong */
  zpRemoteError = 6,        /* a peer died, aborted or stopped answering within the timeout */
  zpInProgress = 7,         /* not an error: an operation is still running */
  zpNumResults = 8
} zpResult_t;

/* Element types. Values match NCCL's, so a cast between the two is safe. */
typedef enum {
  zpInt8 = 0, zpChar = 0,
  zpUint8 = 1,
  zpInt32 = 2, zpInt = 2,
  zpUint32 = 3,
  zpInt64 = 4,
  zpUint64 = 5,
  zpFloat16 = 6, zpHalf = 6,
  zpFloat32 = 7, zpFloat = 7,
  zpFloat64 = 8, zpDouble = 8,
  zpBfloat16 = 9,
  zpNumTypes = 10
} zpDataType_t;

/* The same type as cudaStream_t, so a CUDA stream passes without a cast.
 * NULL means host memory and synchronous completion. */
typedef struct CUstream_st* zpStream_t;

/* An opaque communicator handle. */
typedef struct zpComm* zpComm_t;

/* NCCL's communicator (ncclComm_t is struct ncclComm*), for zpCommGetNcclComm. */
struct ncclComm;

#define ZP_UNIQUE_ID_BYTES 128
/* Created by zpGetUniqueId on one rank and passed to all others (by MPI_Bcast,
 * a file, the environment, ...). It holds the rendezvous address and a random
 * secret: treat it as a password for joining the communicator. One id serves
 * one job: ranks of two jobs given the same id (a file shared by mistake)
 * never form one communicator. Each rank tells the rendezvous its job (ZP_JOB_ID,
 * else its launcher's job variables: zprun's, Slurm's, PMIx's, Open MPI's,
 * torchrun's, LSF's, PBS's); a rank of another job than the first one's, a
 * rank number that joins twice or another nranks fails init on every rank
 * of both jobs with zpInvalidUsage ("two jobs use one unique id"). Without
 * a launcher and without ZP_JOB_ID only a rank number that joins twice
 * before the communicator has formed gives them away: the first nranks to
 * arrive, if of both jobs and all of different ranks, still form one. */
typedef struct {
  char internal[ZP_UNIQUE_ID_BYTES];
} zpUniqueId;

/* Routing modes for inter-node traffic (see zpConfig_t.routing). */
typedef enum {
  zpRoutingDefault = -1, /* ZP_ROUTING, else balanced */
  zpRoutingOff = 0,
  zpRoutingRail = 1,
  zpRoutingBalanced = 2
} zpRouting_t;

/* How much a device call (one with a stream) checks before it enqueues (see
 * zpConfig_t.checkMode). Host calls always compare their arguments with the
 * peers'. */
typedef enum {
  zpCheckDefault = -1, /* ZP_CHECK_MODE, else local */
  zpCheckLocal = 0,    /* this rank's own arguments only, then enqueue: no wait on peers (NCCL's way) */
  zpCheckFull = 1      /* also the peers': a mismatch is zpInvalidUsage on every rank, not a device hang */
} zpCheckMode_t;

#define ZP_CONFIG_UNDEF_INT (-2147483647 - 1)
#define ZP_CONFIG_MAGIC 0x7a70636eu /* "zpcn" */

/* Settings for zpCommInitRankConfig. Always start from ZP_CONFIG_INITIALIZER:
 * size, magic and version let later versions add fields without breaking
 * programs built against this one. A field left undefined (ZP_CONFIG_UNDEF_INT
 * or NULL) takes its value from the environment variable named beside it, or
 * from the default. */
typedef struct {
  size_t size;           /* sizeof(zpConfig_t) */
  unsigned int magic;    /* ZP_CONFIG_MAGIC */
  unsigned int version;  /* ZP_VERSION_CODE */
  int timeoutMs;         /* ZP_TIMEOUT (seconds): how long to wait for a silent peer; default 300 s */
  int routing;           /* ZP_ROUTING: a zpRouting_t */
  const char* nodeId;    /* ZP_NODE_ID: ranks with the same node id share memory; default hostname + boot id */
  const char* netDevices;/* ZP_NET_DEVICES: comma-separated NIC names this rank may use */
  int checkMode;         /* ZP_CHECK_MODE: a zpCheckMode_t */
} zpConfig_t;

#define ZP_CONFIG_INITIALIZER                                               \
  {                                                                         \
    sizeof(zpConfig_t), ZP_CONFIG_MAGIC, ZP_VERSION_CODE,                   \
        ZP_CONFIG_UNDEF_INT, ZP_CONFIG_UNDEF_INT, NULL, NULL,               \
        ZP_CONFIG_UNDEF_INT                                                 \
  }

/* ---- Errors and version ----
 * A call refuses bad arguments with zpInvalidArgument. Where the call is
 * collective and its communicator and kind are known, the refusal is
 * collective too: a standard collective (zpAllReduce ... zpBarrier) on host
 * buffers, or on device buffers under ZP_CHECK_MODE=full, and zpAlltoallv
 * (host buffers; device buffers under ZP_CHECK_MODE=full or with routing on
 * across nodes), still takes part in the call's check of arguments across
 * ranks, saying that it refused and why. That rank returns its own
 * zpInvalidArgument; every other rank returns zpInvalidUsage with "rank R
 * refused zpAllReduce: <its reason>" and writes nothing; and the next call
 * runs normally on every rank. Like the call itself, such a refusal waits
 * for the peers to make their call. Refused at once, on this rank only:
 * a NULL, destroyed or foreign comm (no communicator to agree on), a call
 * made inside zpGroupStart / zpGroupEnd (it is not queued; the group's other
 * calls run at zpGroupEnd, and peers whose group holds the call fail there,
 * as in any group that differs), and a device call under the default
 * ZP_CHECK_MODE=local, which exchanges nothing on the host: there, as in
 * NCCL, the peers' device call waits on the device for this rank's part,
 * which never comes (ZP_CHECK_MODE=full to fail on every rank instead).
 * Point-to-point calls refuse on their own rank only (a receive that refuses
 * a message of another size writes nothing; the sender's call may succeed).
 * A message sent to a rank that then calls something else (an eager send
 * nobody receives before the next collective) leaves the two ranks' message
 * streams out of step for good: the receiving rank reports it (the unmatched
 * message's sender, kind and position) and the communicator breaks on every
 * rank (zpCommGetAsyncError), as after any error that desynchronizes it. */
const char* zpGetErrorString(zpResult_t result);
/* The message of the last failed call on comm (from any thread), or, with
 * comm NULL, of the last error this thread saw: what was wrong, with the
 * ranks and values involved. The string stays valid until this thread's
 * next call of zpGetLastError. */
const char* zpGetLastError(zpComm_t comm);
zpResult_t zpGetVersion(int* version);
/* The value in effect of a ZP_* setting, as text: the environment's, else
 * its default ("" when it has none); zpInvalidArgument for a name that is not
 * a setting (zpconfig --list prints them). For bindings that must agree with
 * the library's defaults. *value stays valid until this thread's next call. */
zpResult_t zpGetParam(const char* name, const char** value);

/* ---- Communicators ---- */
/* Creates a new id and starts, in this process, the rendezvous service that
 * the ranks of one communicator meet at (a thread that ends once they have). */
zpResult_t zpGetUniqueId(zpUniqueId* uniqueId);
/* Collective over nranks processes sharing one id. Blocks until all have
 * joined or the timeout expires. The settings that choose the collectives'
 * algorithms and messages (ZP_COLL_ALGO, ZP_COLL_RING_ABOVE, ZP_COLL_SLICE,
 * ZP_ROUTING, ZP_ROUTE_DIRECT_BELOW, and the zpConfig_t fields that set them)
 * must be the same on every rank: if not, init fails on every rank with
 * zpInvalidUsage naming the setting and both values. */
zpResult_t zpCommInitRank(zpComm_t* comm, int nranks, zpUniqueId commId, int rank);
zpResult_t zpCommInitRankConfig(zpComm_t* comm, int nranks, zpUniqueId commId, int rank,
                                zpConfig_t* config);
/* Creates the communicator a launcher describes in the environment:
 * zprun (ZP_RANK, ZP_NRANKS, ZP_UNIQUE_ID), torchrun (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT; rank 0 hosts the rendezvous), or Open MPI's
 * mpirun (OMPI_COMM_WORLD_RANK / _SIZE, with MASTER_ADDR / MASTER_PORT, or on
 * a single node with no address given, a rendezvous file in /dev/shm), or
 * Slurm's srun (SLURM_PROCID, SLURM_NTASKS; rank 0 hosts the rendezvous at
 * MASTER_ADDR, else at the first host of SLURM_STEP_NODELIST; its port is
 * ZP_MASTER_PORT, else MASTER_PORT + 1, else one derived from SLURM_JOB_ID
 * and SLURM_STEP_ID). config may be NULL. */
zpResult_t zpCommInitFromEnv(zpComm_t* comm, zpConfig_t* config);
/* Frees the communicator. Local: peers that later wait on this rank get
 * zpRemoteError. Work still queued on streams is waited for (up to the
 * timeout). The handle is invalid afterwards (calls with it return
 * zpInvalidArgument). */
zpResult_t zpCommDestroy(zpComm_t comm);
/* Like zpCommDestroy, and tells every peer to fail its pending and future
 * operations with this communicator at once; the NCCL communicator is
 * aborted too, so device work waiting for a dead peer ends (its data is
 * undefined). */
zpResult_t zpCommAbort(zpComm_t comm);
/* zpSuccess, or the error that broke the communicator (a dead peer, a peer
 * that aborted or found the ranks out of step, a failure of device work
 * reported by NCCL, ...). Polling it also moves pending work forward, so a
 * rank between calls learns of such errors. After an error, abort. */
zpResult_t zpCommGetAsyncError(zpComm_t comm, zpResult_t* asyncError);
/* Interrupts (Ctrl-C). A call that has waited on its peers over the host
 * transports for 100 ms calls check(arg) on its own thread, and again every
 * 100 ms while it waits. Once check returns nonzero, the call gives up: its
 * communicator breaks (the call was half done on some peers), the peers fail
 * at once with zpRemoteError, and the call returns zpSystemError, as a system
 * call interrupted by a signal does. Destroy the communicator afterwards.
 * Process-wide; a NULL check removes it. Calls that only enqueue device work
 * and zpCommInitRank's rendezvous do not ask. Python's package installs a
 * check that reports Ctrl-C (KeyboardInterrupt) on the main thread. */
typedef int (*zpInterruptCheck_t)(void* arg);
zpResult_t zpSetInterruptCheck(zpInterruptCheck_t check, void* arg);
/* Which ranks this rank waits for: a rank that lags (a slow host, a data
 * loader that stalls) shows here on every rank that waits for it. A peer's
 * first message of a call arrives when it entered the call: a host
 * collective's header (each rank's reaches every other), a routed
 * zpAlltoallv's count row, the first bytes (or counts) of an unrouted
 * zpAlltoallv's or a receive's message (sends hear nothing and are not
 * counted). In one call, the wait charged to a peer is how much later its
 * message came than the one before it in arrival order, this rank's own
 * entry counted as an arrival (all of it to the last one); in a
 * zpAlltoallv, whose count rows carry each rank's time outside the library
 * before the call, at most what it spent outside beyond that one (a rank
 * that came late because its previous call had more to move is not
 * charged). The report covers the last 100 such calls of this communicator (*nCalls: how
 * many it holds): the peers charged anything, the most charged first; at
 * most maxEntries are written to entries (NULL when maxEntries is 0) and
 * *nEntries says how many there are. A peer that came last in most of them
 * by at least half of ZP_STRAGGLER_MS, that late on average, is also named
 * once in a WARN line.
 * Device calls (a stream) are counted only with ZP_CHECK_MODE=full, the one
 * mode in which they compare headers. From the thread that runs the
 * communicator's calls (not while another thread runs one). */
typedef struct {
  int rank;            /* the peer */
  int callsLast;       /* calls in which its message came last */
  double totalWaitSec; /* the wait charged to it over those calls */
  double maxWaitSec;   /* the most charged to it in one call */
} zpWaitEntry_t;
zpResult_t zpCommGetWaitReport(zpComm_t comm, zpWaitEntry_t* entries, int maxEntries, int* nEntries, int* nCalls);
/* The rails of this rank's node as routing measures them. The node's ranks
 * count each rail's routed bytes from queued to acknowledged; from that
 * every rank samples each rail's rate over the time it was busy. A rail
 * below ZP_RAIL_SLOW percent of the median of the node's other rails in
 * four samples in a row is slow: named once in a WARN line, and given bytes
 * by its measured rate (by zpAlltoallv's plan and the split of routed sends)
 * until it is back above 1.4x that fraction, when a line says so. Other
 * nodes learn it from the relay's headers and a message at each change.
 * One entry per NIC of this node, in rail order; at most maxEntries are
 * written (entries may be NULL when maxEntries is 0), *nEntries says how
 * many there are: 0 when this communicator does not route (one node, one
 * rail, ZP_ROUTING=off). */
typedef struct {
  int rail;                 /* the NIC's index among the node's (rail k: NIC k of every node) */
  char nic[32];             /* its interface name on this node */
  double nominalBitsPerSec; /* its rate from discovery, ZP_TOPO_FILE or ZP_NIC_RATE_BPS (0: unknown) */
  double bitsPerSec;        /* measured (0: no evidence yet) */
  int slow;                 /* 1: slow, so routed around */
  int changes;              /* how many times it turned slow or recovered */
} zpRailEntry_t;
zpResult_t zpCommGetRailReport(zpComm_t comm, zpRailEntry_t* entries, int maxEntries, int* nEntries);
zpResult_t zpCommCount(const zpComm_t comm, int* count);
zpResult_t zpCommUserRank(const zpComm_t comm, int* rank);
/* Whether buf suits a data call on comm with this stream (host memory with a
 * NULL stream, memory of the communicator's GPU with a stream): zpSuccess,
 * or zpInvalidArgument saying what to pass. For layers built on this API that
 * must refuse a bad buffer before they queue anything. */
zpResult_t zpCommCheckBuffer(zpComm_t comm, const void* buf, zpStream_t stream);
/* NCCL's ncclCommSplit: collective over comm. Ranks passing the same color
 * (>= 0) form a new communicator, ranked by key (ties by their rank in comm);
 * a rank passing ZP_SPLIT_NOCOLOR takes part but gets *newcomm = NULL. The
 * new communicator is made through comm's own transports (no new
 * rendezvous): it has its own sequence of calls, errors, abort and destroy,
 * uses the same node identities and NICs (and, in a build with CUDA, gets an
 * NCCL communicator of its own), and lives on after comm is destroyed.
 * config NULL: comm's settings. Not inside a group. If any rank passes a bad
 * argument (color below ZP_SPLIT_NOCOLOR, newcomm NULL, a bad config), every
 * rank fails: that rank with zpInvalidArgument, the others with
 * zpInvalidUsage naming it. Host calls complete before they return, so there
 * is no zpCommFinalize; zpCommDestroy waits for device work. */
#define ZP_SPLIT_NOCOLOR (-1)
zpResult_t zpCommSplit(zpComm_t comm, int color, int key, zpComm_t* newcomm, zpConfig_t* config);
/* The communicator's NCCL communicator (same ranks, its device), for NCCL's own
 * collectives on the same group; Zeppelin keeps ownership (do not destroy it).
 * zpInvalidUsage if the communicator has no device data plane. */
zpResult_t zpCommGetNcclComm(zpComm_t comm, struct ncclComm** ncclComm);

/* ---- Groups ---- */
/* Calls between zpGroupStart and zpGroupEnd are queued and run together at
 * zpGroupEnd (so a rank can send to and receive from many peers without
 * deadlock). Groups nest; the outermost zpGroupEnd runs them. A queued call
 * captures its arguments at the call, as NCCL does: scalars, and the count
 * and displacement arrays of zpAlltoallv, zpAllGatherv and zpReduceScatterv
 * (copied), so those arrays may be freed or reused before zpGroupEnd. Data
 * buffers are read and written at zpGroupEnd: keep them until it returns. */
zpResult_t zpGroupStart(void);
zpResult_t zpGroupEnd(void);

/* ---- Point to point ----
 * Sends and receives between a pair of ranks are matched in the order they
 * are called. count is in elements of datatype. A receive whose count differs
 * from the matching send's fails with zpInvalidUsage and writes nothing. */
zpResult_t zpSend(const void* sendbuff, size_t count, zpDataType_t datatype, int peer,
                  zpComm_t comm, zpStream_t stream);
zpResult_t zpRecv(void* recvbuff, size_t count, zpDataType_t datatype, int peer, zpComm_t comm,
                  zpStream_t stream);
/* Receive from any source (MPI_ANY_SOURCE; NCCL has none): peer
 * ZP_ANY_SOURCE in zpRecv or zpRecvFrom takes the next point-to-point
 * message of the first rank found to have one waiting; each rank's messages
 * are still taken in the order sent, and when several ranks' messages wait,
 * the ranks take turns. Receives match in call order, as MPI's do in
 * posting order: in a group, a receive naming a rank that is called after a
 * receive from any source waits until that one is matched, so it cannot
 * take a message the earlier one could have; receives naming a rank called
 * before it take their messages first. Sends to itself in the same group
 * that no receive naming it takes go to receives from any source. Messages
 * of collectives are never taken. The count must equal the message's, as
 * for zpRecv (unlike MPI, a longer receive does not take a shorter
 * message): another count fails with zpInvalidUsage and writes nothing.
 * zpRecvFrom also writes the sender's rank to *source (may be NULL; in a
 * group it is written at zpGroupEnd). On one node and across nodes, with
 * routing on or off, alike. Host buffers only: with a stream,
 * zpInvalidArgument. On a communicator of one rank, with no send to itself
 * left in the group: zpInvalidUsage at once. A receive that nothing ever
 * matches fails after ZP_TIMEOUT, as any receive does. */
#define ZP_ANY_SOURCE (-1)
zpResult_t zpRecvFrom(void* recvbuff, size_t count, zpDataType_t datatype, int peer, int* source,
                      zpComm_t comm, zpStream_t stream);

/* ---- All-to-all with variable counts ----
 * Rank r sends sendcounts[p] elements starting at element sdispls[p] of
 * sendbuff to rank p, which receives them into recvbuff at element
 * rdispls[r]. Counts and displacements are in elements. sendcounts[p] on
 * rank r must equal recvcounts[r] on rank p; if any pair disagrees, every
 * rank returns zpInvalidUsage with a message naming the ranks and counts,
 * and no byte outside the given receive ranges is written (with a stream:
 * under ZP_CHECK_MODE=full, or with routing on across nodes, where every rank
 * needs the whole count matrix to plan). Receive ranges must not overlap
 * each other or the send ranges. */
zpResult_t zpAlltoallv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                       void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                       zpDataType_t datatype, zpComm_t comm, zpStream_t stream);

/* ---- Collectives (NCCL's names and semantics) ----
 * Collective over the communicator: every rank calls them in the same order
 * with the same count, datatype, op and root (checked on host buffers, and
 * on device buffers under ZP_CHECK_MODE=full: a rank that differs makes the
 * call zpInvalidUsage on every rank, naming it, before any data moves). Counts are in elements of datatype. In place as in NCCL:
 * sendbuff == recvbuff for all-reduce, broadcast and reduce; for all-gather
 * sendbuff == recvbuff + rank * sendcount; for reduce-scatter recvbuff ==
 * sendbuff + rank * recvcount. Buffers that overlap in any other way are
 * zpInvalidArgument on the rank that passes them.
 * On host buffers float16 and bfloat16 are reduced in float32 and rounded
 * once, and zpAvg divides the sum by the rank count once (integers:
 * truncating). On device buffers the arithmetic is NCCL's: 16-bit types are
 * rounded at every hop, and zpAvg of a floating type multiplies each input by
 * 1/nranks in the type before summing, so the last bits may differ from the
 * host path's (integers: the sum divided, truncating, as on the host). Callable inside
 * zpGroupStart / zpGroupEnd (they run in call order after the group's
 * sends and receives). With a stream (device buffers) NCCL's own collective
 * is enqueued on the stream on the communicator's NCCL communicator (NCCL's
 * all-reduce already uses every NIC and NVLink well). zpBarrier does not use
 * its stream: it is a host barrier. */
typedef enum { zpSum = 0, zpProd = 1, zpMax = 2, zpMin = 3, zpAvg = 4, zpNumOps = 5 } zpRedOp_t;
zpResult_t zpAllReduce(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, zpRedOp_t op,
                       zpComm_t comm, zpStream_t stream);
zpResult_t zpBroadcast(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, int root,
                       zpComm_t comm, zpStream_t stream);
/* The result lands in root's recvbuff only (the others' is not touched). */
zpResult_t zpReduce(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, zpRedOp_t op, int root,
                    zpComm_t comm, zpStream_t stream);
/* recvbuff holds nranks * sendcount elements, rank r's at r * sendcount. */
zpResult_t zpAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype, zpComm_t comm,
                       zpStream_t stream);
/* sendbuff holds nranks * recvcount elements; rank r gets the reduction of
 * every rank's block r. */
zpResult_t zpReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, zpDataType_t datatype, zpRedOp_t op,
                           zpComm_t comm, zpStream_t stream);
/* Returns once every rank has called it. */
zpResult_t zpBarrier(zpComm_t comm, zpStream_t stream);
/* All-gather with per-rank counts (MPI_Allgatherv): rank r contributes
 * sendcount elements, which must equal recvcounts[r]; they land at element
 * rdispls[r] of every rank's recvbuff. recvcounts must be the same on every
 * rank (checked with the rest of the call); rdispls are each rank's own, and
 * its receive ranges must not overlap. In place: sendbuff == recvbuff +
 * rdispls[rank] elements. With a stream: one NCCL broadcast per rank's
 * block, in one NCCL group. */
zpResult_t zpAllGatherv(const void* sendbuff, size_t sendcount, void* recvbuff, const size_t recvcounts[],
                        const size_t rdispls[], zpDataType_t datatype, zpComm_t comm, zpStream_t stream);
/* Reduce-scatter with per-rank counts (MPI_Reduce_scatter): sendbuff holds
 * recvcounts[0] + ... + recvcounts[nranks-1] elements; rank r gets the
 * recvcounts[r] of them that start at element recvcounts[0] + ... +
 * recvcounts[r-1], reduced over every rank. recvcounts must be the same on
 * every rank. In place: recvbuff == sendbuff + that offset. With a stream:
 * one NCCL reduce per rank's block, in one NCCL group. */
zpResult_t zpReduceScatterv(const void* sendbuff, void* recvbuff, const size_t recvcounts[], zpDataType_t datatype,
                            zpRedOp_t op, zpComm_t comm, zpStream_t stream);

/* ---- Batch plans ----
 * The hierarchical partition planner: where every token of a variable-length
 * batch lives for attention and for the linear layers. Deterministic and
 * local: every rank calling it with the same input gets the same plan. */
typedef struct {
  int qHeads;    /* query heads */
  int kvHeads;   /* key/value heads */
  int headDim;
  int elemBytes; /* bytes per element (2 for bf16) */
  int causal;    /* nonzero: causal attention, zigzag chunks */
} zpAttnShape_t;

/* The modelled cluster (see the README's cost model). */
typedef struct {
  int nodes;
  int ranksPerNode;
  int nicsPerNode;
  double nicGbps;       /* per NIC, Gbit/s */
  double intraNodeGBps; /* per rank, GB/s */
  double tflops;        /* dense peak per rank */
  double efficiency;    /* fraction of peak attention reaches, in (0, 1] */
} zpClusterModel_t;

typedef struct { int64_t seq; int64_t start; int64_t count; } zpSegment_t;

typedef struct zpBatchPlan* zpBatchPlan_t;
/* A plan's two layouts: where tokens live for attention, and for the linear layers. */
typedef enum { zpAttentionLayout = 0, zpLinearLayout = 1 } zpLayoutKind_t;

/* Plans a batch of nseqs sequences for the cluster model given or, with
 * cluster NULL, for comm's cluster: its nodes, ranks per node (numbered node
 * by node) and NICs per node, the NIC rate it measured (else 200 Gbit/s),
 * and the model's default compute and intra-node rates (312 TFLOPS at 50%,
 * 200 GB/s: an A800 node). Free with zpPlanDestroy. */
zpResult_t zpPlanBatch(zpBatchPlan_t* plan, int nseqs, const int64_t* seqLens,
                       const zpAttnShape_t* shape, const zpClusterModel_t* cluster,
                       zpComm_t comm);
zpResult_t zpPlanDestroy(zpBatchPlan_t plan);
/* Plans ahead: zpPlanBatch's planning of a batch started on a thread of its
 * own, so that the next batch is planned while the current step runs. The
 * input is checked and copied (with comm, its cluster read) before this
 * returns. zpPlanAheadWait waits for the thread and hands over the plan,
 * the same plan zpPlanBatch makes of the same input (or the planner's
 * refusal of it, as zpPlanBatch's error), and frees `ahead` either way.
 * Every zpPlanBatchAhead needs its zpPlanAheadWait. */
typedef struct zpPlanAhead* zpPlanAhead_t;
zpResult_t zpPlanBatchAhead(zpPlanAhead_t* ahead, int nseqs, const int64_t* seqLens, const zpAttnShape_t* shape,
                            const zpClusterModel_t* cluster, zpComm_t comm);
zpResult_t zpPlanAheadWait(zpPlanAhead_t ahead, zpBatchPlan_t* plan);
/* A plan whose rings the caller chooses (its own partitioner, or plain ring
 * attention over all ranks): sequence s runs on the ranks
 * ringRanks[ringOffsets[s] .. ringOffsets[s+1]) in ring order (one rank:
 * local), cut into chunks as zpPlanBatch does (causal: zigzag, chunks i and
 * 2G-1-i on ring rank i). ranksPerNode (0: one node) only sorts rings into
 * intra- and inter-node ones. The linear layout balances tokens as
 * zpPlanBatch's does. Checked: lengths >= 1, ranks in range, none twice in a
 * ring. */
zpResult_t zpPlanCreate(zpBatchPlan_t* plan, int nseqs, const int64_t* seqLens, int causal, int nranks,
                        int ranksPerNode, const size_t* ringOffsets, const int* ringRanks);

/* Sequence seq's class (0 local, 1 intra-node, 2 inter-node) and its ring of
 * ranks (valid until zpPlanDestroy). */
zpResult_t zpPlanSequence(zpBatchPlan_t plan, int64_t seq, int* cls, int* nranks,
                          const int** ranks);
/* The segments rank holds in the plan's attention or linear layout, in
 * buffer order (valid until zpPlanDestroy). */
zpResult_t zpPlanRankSegments(zpBatchPlan_t plan, zpLayoutKind_t kind, int rank,
                              const zpSegment_t** segs, size_t* n);
/* The order attention runs in: every sequence id once, *nseqs of them
 * (valid until zpPlanDestroy or zpPlanSetRingOrder). Each rank runs its
 * rings and its local sequences in this order forward and in the reverse
 * order backward; sequences that share a ring (the same ranks in the same
 * ring order) run as one, at the place of the first of them. A plan starts
 * with the planner's order (zpPlanCreate's: inter-node rings, then
 * intra-node rings, then local sequences, each by sequence id). */
zpResult_t zpPlanRingOrder(zpBatchPlan_t plan, const int64_t** seqs, int* nseqs);
/* Replaces the plan's order with seqs[0 .. nseqs) (a caller's own schedule).
 * zpInvalidArgument, the plan unchanged, unless it names every sequence of
 * the plan exactly once. Every rank must give the same order; a driver
 * (zpAttentionCreate) keeps the order it was created with. */
zpResult_t zpPlanSetRingOrder(zpBatchPlan_t plan, int nseqs, const int64_t* seqs);

/* ---- Layouts and remaps ----
 * A layout says where every token of a batch of sequences lives: for each
 * rank, an ordered list of segments (zpSegment_t). A rank's buffer holds its
 * segments' tokens back to back, in that order, each token as elemsPerToken
 * elements (hidden states, q/k/v, gradients). A layout comes from a plan
 * (zpPlanGetLayout) or from the user's own arrays (zpLayoutCreate, checked:
 * every token of every sequence on exactly one rank, else zpInvalidArgument
 * naming the first problem). */
typedef struct zpLayout* zpLayout_t;

/* Rank r's segments are segments[rankSegOffsets[r] .. rankSegOffsets[r+1]). */
zpResult_t zpLayoutCreate(zpLayout_t* layout, int nseqs, const int64_t* seqLens, int nranks,
                          const size_t* rankSegOffsets, const zpSegment_t* segments);
zpResult_t zpLayoutDestroy(zpLayout_t layout);
zpResult_t zpLayoutRankTokens(zpLayout_t layout, int rank, int64_t* tokens);
/* The segments stay owned by the layout. */
zpResult_t zpLayoutRankSegments(zpLayout_t layout, int rank, const zpSegment_t** segments, size_t* count);

/* A plan's layout (owned by the plan: valid until zpPlanDestroy). */
zpResult_t zpPlanGetLayout(zpBatchPlan_t plan, zpLayoutKind_t kind, zpLayout_t* layout);

/* A remap moves tokens from one layout to another (and back: inverse = 1,
 * for the backward pass). Host buffers (NULL stream): tokens already on
 * their target rank are copied locally; the rest move as one zpAlltoallv
 * (through the router across nodes). Device buffers (a stream): every run of
 * tokens is one send and one receive of a single group enqueued on the
 * stream, this rank's own runs included, with no staging copy. in and out
 * must not overlap. Collective over the communicator, whose size must equal
 * the layouts' rank count; zpRemapExecute takes the same communicator as
 * zpRemapCreate, and inverse is 0 or 1. */
typedef struct zpRemap* zpRemap_t;
zpResult_t zpRemapCreate(zpRemap_t* remap, zpLayout_t from, zpLayout_t to, zpComm_t comm);
zpResult_t zpRemapExecute(zpRemap_t remap, const void* in, void* out, size_t elemsPerToken, zpDataType_t datatype,
                          int inverse, zpComm_t comm, zpStream_t stream);
zpResult_t zpRemapDestroy(zpRemap_t remap);

/* The variable-length Ulysses all-to-all over the communicator (the
 * sequence-parallel group): direction 0 turns the sequence-parallel layout,
 * in = [this rank's tokens in layout order, heads, headDim], into the
 * head-parallel one, out = [every token of the batch in cu_seqlens order,
 * this rank's heads, headDim]; direction 1 goes back. Any head count and any
 * lengths (up to 65536 query heads): rank r of G takes query heads
 * [r*qHeads/G, (r+1)*qHeads/G) (some ranks may get none). heads is the tensor's own head count: qHeads for
 * queries and outputs; for GQA keys and values (heads dividing qHeads) rank r
 * gets the heads its query heads use, so a head may go to several ranks, and
 * direction 1 sums their contributions (float32 or float64 then). */
zpResult_t zpUlyssesAlltoall(const void* in, void* out, zpLayout_t layout, int qHeads, int heads, int headDim,
                             zpDataType_t datatype, int direction, zpComm_t comm, zpStream_t stream);

/* ---- Rings ----
 * A ring over an ordered subset of the communicator's ranks (all ranks, one
 * node's, one per node, a planner's ring for a sequence); several may be
 * alive at once. An exchange sends this rank's block to the next rank and
 * receives the previous rank's: zpRingExchangeStart returns at once (a
 * worker thread of the ring runs the exchange), so the caller computes on
 * one block while the next arrives (double buffering: two receive buffers),
 * and zpRingExchangeWait returns its result. Sizes may differ every step
 * (recvBytes must equal what the previous rank sends). bidirectional: half
 * of each block goes each way round (for links that carry both directions at
 * full rate; every rank of the ring passes blocks of the same size in a
 * step, and the receive buffer holds the previous rank's first half, then
 * the next rank's second half). While an exchange runs, its communicator
 * serves no other call, including another ring's exchange: to run the
 * exchanges of several rings at once, give each ring its own communicator.
 * With a stream (device buffers) the exchange is enqueued on it as one group
 * and zpRingExchangeStart returns; the stream orders its completion (overlap
 * it with compute on another stream, through events), and
 * zpRingExchangeWait only returns whether it was enqueued. */
typedef struct zpRing* zpRing_t;
zpResult_t zpRingCreate(zpRing_t* ring, zpComm_t comm, int nranks, const int* ranks, int bidirectional);
zpResult_t zpRingExchangeStart(zpRing_t ring, const void* sendbuf, size_t sendBytes, void* recvbuf, size_t recvBytes,
                               zpStream_t stream);
zpResult_t zpRingExchangeWait(zpRing_t ring);
zpResult_t zpRingDestroy(zpRing_t ring);

/* ---- Attention block kernels ----
 * The contract between Zeppelin's ring-attention driver and the user's
 * attention kernel (flash-attention's varlen forward returns out and lse the
 * same way): one call per (query block, key/value block) pair. Layouts:
 * q, out, dout, dq [sq, qHeads, headDim]; k, v, dk, dv [sk, kvHeads,
 * headDim] (kvHeads divides qHeads: GQA); lse [qHeads, sq], natural log.
 * Types: the inputs q, k, v and dout are of datatype (zpFloat32,
 * zpBfloat16 or zpFloat16); out, lse, dq, dk and dv are always float32 (the
 * driver accumulates in float32 and rounds once at the end).
 * zpMaskCausal is a diagonal block (sq == sk, query i sees keys 0..i);
 * zpMaskSkip blocks are never passed to kernels (zigzag chunking makes many
 * pairs empty). Forward writes out and lse of this block (a row that sees
 * nothing: out 0, lse -inf); blocks are combined with zpAttnMergeLse.
 * Backward takes out and lse of the whole row (all blocks merged) and ADDS
 * this block's share into dq, dk and dv. With accumulate set (forward only,
 * for kernels that say they can: zpAttnConfig_t.kernelAccumulates), out and
 * lse already hold the rows' result over earlier blocks and the kernel folds
 * this block into them as zpAttnMergeLse would, saving the driver a pass
 * over the output.
 * stream NULL: host buffers, the work done when the kernel returns. A
 * stream: device buffers, and the kernel may only enqueue its work on that
 * stream and return (no host synchronisation, no other stream unless joined
 * back to it by events); the driver orders everything else after it. */
typedef enum { zpMaskFull = 0, zpMaskCausal = 1, zpMaskSkip = 2 } zpAttnMask_t;
typedef struct {
  const void* q;
  const void* k;
  const void* v;
  float* out;
  float* lse;
  const void* dout; /* backward only */
  float* dq;
  float* dk;
  float* dv;
  int64_t sq, sk;
  int qHeads, kvHeads, headDim;
  float scale; /* softmax scale, usually 1/sqrt(headDim) */
  zpAttnMask_t mask;
  int accumulate; /* forward: fold into out and lse instead of overwriting them */
  zpDataType_t datatype; /* of q, k, v, dout: zpFloat32, zpBfloat16 or zpFloat16 */
  zpStream_t stream;     /* NULL: host buffers; else the stream to enqueue on */
} zpAttnBlock_t;
typedef zpResult_t (*zpAttnKernel_t)(const zpAttnBlock_t* block, void* user);
/* The reference kernels (float64 inside, exact softmax). With a NULL stream
 * they run on the host; with a stream they enqueue a simple device kernel
 * (one thread per query row and head, head dims up to 256) in a build with
 * CUDA. */
zpResult_t zpAttnRefForward(const zpAttnBlock_t* block, void* user);
zpResult_t zpAttnRefBackward(const zpAttnBlock_t* block, void* user);
/* Folds a block's partial result (partOut, partLse) into (out, lse): host
 * buffers, or device buffers with a stream (enqueued on it). */
zpResult_t zpAttnMergeLse(float* out, float* lse, const float* partOut, const float* partLse, int64_t sq, int qHeads,
                          int headDim, zpStream_t stream);

/* ---- Ring attention driver ----
 * Runs attention forward and backward for every sequence of a batch plan,
 * calling the user's block kernels (above) for every (query chunk, key/value
 * chunk) pair that is not masked out. Sequences split over a ring of G ranks
 * pass their key/value chunks round the ring while the kernel works on the
 * chunk held (G-1 hops; backward also passes the key/value gradients, G
 * hops); local sequences take one kernel call each. Rings run in the plan's
 * order (zpPlanRingOrder: a ring at the place of the first of its
 * sequences) forward and in the reverse order backward, and so do local
 * sequences, which also fill the time spent waiting for a ring's next block
 * (taken in that order; what is left runs after the last ring). Partial
 * outputs are merged by their log-sum-exp (zpAttnMergeLse), or folded in by
 * the kernel itself (kernelAccumulates).
 *
 * Buffers are in the plan's attention layout of this rank, T tokens
 * (zpLayoutRankTokens of zpPlanGetLayout(plan, zpAttentionLayout)):
 * q, out, dout, dq [T, qHeads, headDim]; k, v, dk, dv [T, kvHeads, headDim],
 * all of the config's datatype; lse [qHeads, T] (natural log), float32.
 * Every element of out, lse, dq, dk and dv is written. Collective over the
 * communicator the plan's rings refer to (its size must equal the plan's
 * rank count); every rank passes the same plan. The calls use the
 * communicator for their whole length: no other call on it may run
 * meanwhile.
 *
 * stream NULL: host buffers; the call returns when the results are there.
 * A stream: device buffers (each checked as zpCommCheckBuffer does); the
 * whole pass is enqueued and the call returns without waiting for the GPU.
 * The kernels, merges, gradient additions and fills run on the stream; the
 * exchanges run on an internal stream of the driver, forked from and joined
 * back to the caller's stream by events, so they overlap the kernels, and
 * the caller's work before and after the call is ordered with the pass.
 * Local sequences are spread over the exchanges in proportion to their cost
 * (on the host they fill each wait until the exchange is over).
 *
 * If a kernel fails, the call returns its error on that rank once the
 * exchange in flight is over; its ring peers then fail with zpRemoteError
 * after the timeout, or at once if the caller aborts the communicator
 * (zpCommAbort), as with NCCL. With a stream, failures after the call
 * returned (a dead peer) arrive through zpCommGetAsyncError. */
typedef struct {
  int qHeads;
  int kvHeads;  /* divides qHeads (grouped-query attention) */
  int headDim;
  float scale;  /* softmax scale; 0 means 1/sqrt(headDim) */
  zpAttnKernel_t forward;  /* e.g. zpAttnRefForward */
  zpAttnKernel_t backward; /* e.g. zpAttnRefBackward; may be NULL for forward only */
  void* user;              /* passed to the kernels */
  int kernelAccumulates;   /* nonzero: the forward kernel honours zpAttnBlock_t.accumulate */
  zpDataType_t datatype;   /* of every buffer but lse: zpFloat32, zpBfloat16 or zpFloat16 */
} zpAttnConfig_t;
typedef struct zpAttention* zpAttention_t;
/* Local (no communication). The driver keeps what it needs of the plan. */
zpResult_t zpAttentionCreate(zpAttention_t* attn, zpBatchPlan_t plan, const zpAttnConfig_t* config, zpComm_t comm);
zpResult_t zpAttentionForward(zpAttention_t attn, const void* q, const void* k, const void* v, void* out, float* lse,
                              zpStream_t stream);
zpResult_t zpAttentionBackward(zpAttention_t attn, const void* q, const void* k, const void* v, const void* out,
                               const float* lse, const void* dout, void* dq, void* dk, void* dv, zpStream_t stream);
/* Waits for the driver's device work, if any, and frees it. zpInvalidUsage
 * (nothing freed) while the driver's exchange stream is part of a CUDA stream
 * capture that has not ended: destroy it after cudaStreamEndCapture. */
zpResult_t zpAttentionDestroy(zpAttention_t attn);

/* Size in bytes of one element of datatype, or 0 for an invalid type. */
size_t zpTypeSize(zpDataType_t datatype);

/* Bytes one call may move per buffer: counts beyond it are rejected as
 * zpInvalidArgument (they usually are negative values cast to size_t). */
#define ZP_MAX_CALL_BYTES ((size_t)1 << 48)

/* ---- For layers built on this API ----
 * Zeppelin's own remaps, Ulysses exchange, rings and attention driver use
 * only the calls above and these, as a user's extension would. */

/* Records a message (printf format) as the last error of comm (NULL: none)
 * and of the calling thread, logs it at WARN when ZP_DEBUG allows, and
 * returns code. With code zpSuccess it clears the thread's last error instead. */
zpResult_t zpSetLastError(zpComm_t comm, zpResult_t code, const char* format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* A layout's rank count and its batch: nseqs sequences of seqLens tokens
 * (owned by the layout). Any output may be NULL. */
zpResult_t zpLayoutGetInfo(zpLayout_t layout, int* nranks, int* nseqs, const int64_t** seqLens);
/* The same of a plan, and whether its sequences are causal. */
zpResult_t zpPlanGetInfo(zpBatchPlan_t plan, int* nranks, int* nseqs, const int64_t** seqLens, int* causal);
/* Has hook(device) called in this process once per CUDA device, with that
 * device current: where the first communicator with a device data plane on
 * it is created (before the create returns), or at once, from this call,
 * for a device that has had one already. For a layer's own CUDA kernels,
 * to load them there: CUDA loads a kernel lazily at its first launch, which
 * may synchronise the whole device and so wait for a stream the caller
 * holds (docs/device.md). A hook must not call zpAddDeviceInitHook.
 * zpInvalidArgument for NULL. */
typedef void (*zpDeviceInitHook_t)(int device);
zpResult_t zpAddDeviceInitHook(zpDeviceInitHook_t hook);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZEPPELIN_H_ */
