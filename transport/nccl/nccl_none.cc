// The device data plane of a build without CUDA: there is none, and each
// function says so.
#include "transport/nccl/nccl_transport.h"

#include "src/core/log.h"

namespace zp {

namespace {
const char* kWhy = "this build of Zeppelin has no CUDA (configure with -DZP_WITH_CUDA=ON where CUDA and NCCL are installed)";
}

bool deviceUsable(std::string* why) {
  *why = kWhy;
  return false;
}

zpResult_t chooseDevice(int, int*) { return fail(zpInvalidUsage, "%s", kWhy); }
zpResult_t addDeviceInitHook(void (*hook)(int)) {
  // No device communicator is ever created here: the hook never runs.
  return hook ? zpSuccess : fail(zpInvalidArgument, "zpAddDeviceInitHook: hook is NULL");
}
zpResult_t makeNcclId(std::string*) { return fail(zpInvalidUsage, "%s", kWhy); }
zpResult_t createNcclTransport(const std::string&, int, int, int, int, std::unique_ptr<StreamTransport>*) {
  return fail(zpInvalidUsage, "%s", kWhy);
}

}  // namespace zp
