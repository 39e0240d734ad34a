/*
 * fakecuda.h: the test double's own calls, beside the CUDA runtime and NCCL
 * functions it implements (declared by the real cuda_runtime_api.h and
 * nccl.h). See README.md in this folder.
 */
#ifndef FAKECUDA_H_
#define FAKECUDA_H_

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A host-compiled "kernel": fn(arg) runs on the stream's own thread, in order
 * with the stream's other work. arg (argBytes) is copied at the call, as a
 * kernel's parameters are. */
cudaError_t fakecudaLaunch(cudaStream_t stream, void (*fn)(void* arg), const void* arg, size_t argBytes);

/* The read-write alias of device memory [devPtr, devPtr + bytes), for code
 * run by fakecudaLaunch only: from any other thread it aborts the process
 * with "host code touched device memory". Also aborts on a range that is not
 * inside one allocation. */
void* fakecudaAlias(const void* devPtr, size_t bytes);

/* The next operation enqueued on stream fails with error: the stream's
 * synchronisation (and cudaStreamQuery) returns it once. */
cudaError_t fakecudaInjectStreamError(cudaStream_t stream, cudaError_t error);

/* The communicator's asynchronous state becomes error (as a failure inside
 * NCCL would make it): ncclCommGetAsyncError reports it from now on. */
ncclResult_t fakencclInjectAsyncError(ncclComm_t comm, ncclResult_t error);

/* Bytes this communicator's sends to peer have moved so far (its sends to
 * itself included when peer is its own rank), counted when they have left:
 * which ranks' NCCL traffic carried what, e.g. whether routed traffic went
 * through proxies. */
ncclResult_t fakencclPeerBytes(ncclComm_t comm, int peer, unsigned long long* sent);

/* The communicator's bounded work queue (README.md): *blocks, how many times
 * an enqueue call (ncclSend, ncclRecv, ncclGroupEnd, a collective) blocked
 * its host thread on a full queue until the device drained some; *most, the
 * most operations it ever had enqueued and not done. Either may be NULL. */
ncclResult_t fakencclQueueStats(ncclComm_t comm, unsigned long long* blocks, unsigned long long* most);

/* How many times so far a thread of this process waited in the runtime for
 * device work (cudaStreamSynchronize, cudaEventSynchronize,
 * cudaDeviceSynchronize, and the synchronous cudaMemcpy, cudaMemset and
 * cudaFree, which wait the same way), or in NCCL on a full work queue
 * (fakencclQueueStats): a call that must only enqueue shows as a change of
 * this count. */
unsigned long long fakecudaHostWaits(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDA_H_ */
