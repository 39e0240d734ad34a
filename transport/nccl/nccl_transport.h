// NCCL as the device data plane: a StreamTransport whose ops become grouped
// ncclSend / ncclRecv on the callers' streams. This header names no CUDA
// type, so the layers above compile without CUDA; a build without CUDA links
// nccl_none.cc, whose functions say why there is no device path.
#pragma once

#include <memory>
#include <string>

#include "src/core/transport.h"

namespace zp {

// Whether this build has the device path and this process a device it may
// use (ZP_CUDA_DEVICE is not "none", the CUDA runtime answers). If not, why.
bool deviceUsable(std::string* why);

// The device this rank's communicator uses (ZP_CUDA_DEVICE: local, current
// or an ordinal), given its index among its node's ranks.
zpResult_t chooseDevice(int localRank, int* device);

// zpAddDeviceInitHook: hook(device) runs once per device in this process,
// with the device current, where its first NCCL communicator is created
// (createNcclTransport), or at once for a device that has had one.
zpResult_t addDeviceInitHook(void (*hook)(int device));

// A new ncclUniqueId, as bytes to carry to the other ranks.
zpResult_t makeNcclId(std::string* id);

// Creates the NCCL communicator of this rank on device (collective: every
// rank calls it with the same id). Gives up after timeoutMs.
zpResult_t createNcclTransport(const std::string& id, int nranks, int rank, int device, int timeoutMs,
                               std::unique_ptr<StreamTransport>* out);

}  // namespace zp
