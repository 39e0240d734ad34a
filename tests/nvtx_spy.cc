// An NVTX injection library, as a profiler provides one: loaded by NVTX
// (NVTX_INJECTION64_PATH) at a process's first NVTX call, it takes the
// domain calls and writes each range to NVTX_SPY_DIR/<pid>.log, one line per
// push ("push THREAD DOMAIN NAME") and pop ("pop THREAD DOMAIN"; ranges nest
// per thread), so that a test can see which ranges a library opens and
// whether it closes them.
#include <nvtx3/nvToolsExt.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

std::mutex gMu;
FILE* gLog = nullptr;

// Domains and strings are handed out as copies of their names.
const char* nameOf(const void* handle) { return handle ? (const char*)handle : "(default)"; }

void line(const std::string& text) {
  std::lock_guard<std::mutex> l(gMu);
  if (!gLog) {
    const char* dir = getenv("NVTX_SPY_DIR");
    const std::string path = std::string(dir ? dir : "/tmp") + "/" + std::to_string(getpid()) + ".log";
    gLog = fopen(path.c_str(), "a");
    if (!gLog) return;
    setvbuf(gLog, nullptr, _IOLBF, 0);  // a rank may exit without closing it
  }
  fprintf(gLog, "%s\n", text.c_str());
}

nvtxDomainHandle_t NVTX_API domainCreateA(const char* name) { return (nvtxDomainHandle_t)strdup(name); }

nvtxStringHandle_t NVTX_API registerStringA(nvtxDomainHandle_t, const char* s) { return (nvtxStringHandle_t)strdup(s); }

int NVTX_API rangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  std::string name = "(no message)";
  if (a && a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) name = nameOf(a->message.registered);
  if (a && a->messageType == NVTX_MESSAGE_TYPE_ASCII) name = a->message.ascii;
  line("push " + std::to_string(syscall(SYS_gettid)) + " " + nameOf(domain) + " " + name);
  return 0;
}

int NVTX_API rangePop(nvtxDomainHandle_t domain) {
  line("pop " + std::to_string(syscall(SYS_gettid)) + " " + nameOf(domain));
  return 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getTable) {
  auto* callbacks = (const NvtxExportTableCallbacks*)getTable(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || !table) return 0;
  auto set = [&](unsigned id, NvtxFunctionPointer f) {
    if (id < size && table[id]) *table[id] = f;
  };
  set(NVTX_CBID_CORE2_DomainCreateA, (NvtxFunctionPointer)domainCreateA);
  set(NVTX_CBID_CORE2_DomainRegisterStringA, (NvtxFunctionPointer)registerStringA);
  set(NVTX_CBID_CORE2_DomainRangePushEx, (NvtxFunctionPointer)rangePushEx);
  set(NVTX_CBID_CORE2_DomainRangePop, (NvtxFunctionPointer)rangePop);
  return 1;
}
