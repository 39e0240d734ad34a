// Logging in NCCL's manner: ZP_DEBUG=WARN|INFO|TRACE picks the level (default
// WARN), ZP_DEBUG_SUBSYS=INIT,BOOTSTRAP,SHM,COLL,P2P,NET (or ALL; a leading ^
// excludes) picks subsystems, ZP_DEBUG_FILE writes to a file instead of stderr
// (%h becomes the hostname, %p the pid).
//
// Errors go through fail(): it records the message as this thread's last
// error (zpGetLastError) and logs it at WARN (ZP_DEBUG_ERRORS=INFO: at INFO,
// for bindings whose exceptions carry the text), so a caller always has the
// words that explain a result code.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdint>

#include "include/zeppelin.h"

namespace zp {

enum LogLevel { kLogNone = 0, kLogWarn = 1, kLogInfo = 2, kLogTrace = 3 };
enum LogSubsys : unsigned {
  kSubInit = 1u << 0,
  kSubBootstrap = 1u << 1,
  kSubShm = 1u << 2,
  kSubColl = 1u << 3,
  kSubP2P = 1u << 4,
  kSubNet = 1u << 5,
  kSubAll = ~0u,
};

// Whether a line of this level and subsystem is written. Inline, since
// every call asks (ZP_INFO): the level and subsystems in force are kept in
// one word once read from the environment (logGate(), then never changed).
namespace detail {
extern std::atomic<uint64_t> gLogGate;  // 0: not read yet; else bit 32 | level << 40 | subsystems
uint64_t logGate();
}  // namespace detail
inline bool logEnabled(LogLevel level, unsigned subsys) {
  uint64_t g = detail::gLogGate.load(std::memory_order_relaxed);
  if (__builtin_expect(g == 0, 0)) g = detail::logGate();
  return (int)level <= (int)(g >> 40) && ((unsigned)g & subsys);
}
void logMessage(LogLevel level, unsigned subsys, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Records msg as the thread's last error, logs it, and returns code.
zpResult_t fail(zpResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
zpResult_t failv(zpResult_t code, const char* fmt, va_list ap);
const char* lastError();
void clearLastError();

// For a C entry point's catch (...): no C++ exception may cross the C API.
// Out of memory is zpSystemError, anything else zpInternalError, with fn
// and what was thrown in the message.
zpResult_t failFromException(const char* fn);

}  // namespace zp

#define ZP_LOG(level, subsys, ...)                                                 \
  do {                                                                             \
    if (::zp::logEnabled(level, subsys)) ::zp::logMessage(level, subsys, __VA_ARGS__); \
  } while (0)
#define ZP_WARN(subsys, ...) ZP_LOG(::zp::kLogWarn, subsys, __VA_ARGS__)
#define ZP_INFO(subsys, ...) ZP_LOG(::zp::kLogInfo, subsys, __VA_ARGS__)
#define ZP_TRACE(subsys, ...) ZP_LOG(::zp::kLogTrace, subsys, __VA_ARGS__)

// Propagates a non-success result.
#define ZP_CHECK(call)                         \
  do {                                         \
    zpResult_t zp_check_res_ = (call);         \
    if (zp_check_res_ != zpSuccess) return zp_check_res_; \
  } while (0)
