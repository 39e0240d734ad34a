/* fakecuda.h: the extension API of the CUDA runtime / NCCL test double
 * (libfakecuda.so). Code that is built against the double includes this in
 * addition to the real cuda_runtime_api.h and nccl.h; nothing here exists in
 * real CUDA, so code that calls it is test-only. See README.md. */
#ifndef FAKECUDA_H_
#define FAKECUDA_H_

#include <stddef.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Runs fn(copy of arg) on the stream's thread, in order with the stream's
 * other work, as a kernel launch would. argBytes bytes of arg are copied at
 * the call (kernel arguments are captured at launch); arg may be NULL when
 * argBytes is 0. Inside fn, device memory is reachable only through
 * fakecudaAlias. Returns cudaErrorInvalidValue for a NULL fn, or
 * cudaErrorInvalidResourceHandle for an unknown stream. */
cudaError_t fakecudaLaunch(cudaStream_t stream, void (*fn)(void* arg), void* arg, size_t argBytes);

/* The read-write alias of bytes [devPtr, devPtr+bytes) of one device
 * allocation (or devPtr itself for cudaMallocHost memory). Callable ONLY from
 * a function run by fakecudaLaunch: from any other thread it aborts with
 * "host code touched device memory". Aborts as well (an illegal address on a
 * GPU) when the range leaves its allocation, the pointer is not device
 * memory, or the memory is on another device than the stream's. */
void* fakecudaAlias(const void* devPtr, size_t bytes);

/* Makes the next operation that RUNS on the stream fail with err instead of
 * running: the stream's error is then sticky (README: "Faults"). */
cudaError_t fakecudaInjectStreamError(cudaStream_t stream, cudaError_t err);

/* A fixed delay in microseconds before every item of this stream, added to
 * the random FAKECUDA_DELAY_US one: makes one stream reliably slow in tests. */
cudaError_t fakecudaStreamSetDelay(cudaStream_t stream, unsigned int delayUs);

/* The seed of the random delays (FAKECUDA_SEED or a random one), to print
 * when a test fails. */
unsigned long long fakecudaSeed(void);

/* Sets the communicator's asynchronous error now, as if its transport had
 * failed: ncclCommGetAsyncError returns err, and its unfinished and later
 * operations never complete (abort the communicator). err must not be
 * ncclSuccess or ncclInProgress (ncclInvalidArgument otherwise). */
ncclResult_t fakencclInjectAsyncError(ncclComm_t comm, ncclResult_t err);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDA_H_ */
