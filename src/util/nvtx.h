// NVTX ranges around the C API's calls, in the domain "Zeppelin", so that a
// profiler that reads NVTX (Nsight Systems, or any injection library given
// by NVTX_INJECTION64_PATH) shows every call on the timeline, as NCCL shows
// its own. NVTX v3 is header-only (it comes with the CUDA toolkit): with no
// profiler attached, NVTX's calls find no function to forward to and
// return. A build without the toolkit's nvtx3 headers has no ranges
// (ZP_WITH_NVTX unset).
#pragma once

#if ZP_WITH_NVTX
#include <nvtx3/nvToolsExt.h>

namespace zp {

inline nvtxDomainHandle_t nvtxDomain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("Zeppelin");
  return domain;
}

// A range's attributes: its name, registered once.
inline nvtxEventAttributes_t nvtxNamed(const char* name) {
  nvtxEventAttributes_t a = {};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = nvtxDomainRegisterStringA(nvtxDomain(), name);
  return a;
}

// A range from construction to destruction.
class NvtxRange {
 public:
  explicit NvtxRange(const nvtxEventAttributes_t* a) : domain_(nvtxDomain()) { nvtxDomainRangePushEx(domain_, a); }
  ~NvtxRange() { nvtxDomainRangePop(domain_); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  nvtxDomainHandle_t domain_;
};

}  // namespace zp

// The rest of the enclosing block is a range named `name` (a string
// literal; its attributes are made once per call site).
#define ZP_NVTX_RANGE(name)                                                             \
  static const nvtxEventAttributes_t zpNvtxAttributes_ = ::zp::nvtxNamed(name); \
  const ::zp::NvtxRange zpNvtxRange_(&zpNvtxAttributes_)
#else
#define ZP_NVTX_RANGE(name) \
  do {                      \
  } while (0)
#endif
