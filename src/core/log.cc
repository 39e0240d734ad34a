#include "src/core/log.h"

#include "src/core/params.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>

namespace zp {
namespace {

struct LogState {
  int level = kLogWarn;
  int errorLevel = kLogWarn;  // of the errors calls return (ZP_DEBUG_ERRORS)
  unsigned subsys = kSubAll;
  FILE* out = stderr;
  char host[64] = {0};
};

unsigned parseSubsys(const char* s) {
  static const struct { const char* name; unsigned bit; } kNames[] = {
      {"INIT", kSubInit}, {"BOOTSTRAP", kSubBootstrap}, {"SHM", kSubShm},
      {"COLL", kSubColl}, {"P2P", kSubP2P},             {"NET", kSubNet},
      {"ALL", kSubAll}};
  bool invert = (*s == '^');
  if (invert) s++;
  unsigned mask = 0;
  std::string list(s);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string tok = list.substr(pos, end - pos);
    for (auto& n : kNames)
      if (strcasecmp(tok.c_str(), n.name) == 0) mask |= n.bit;
    pos = end + 1;
  }
  return invert ? ~mask : mask;
}

// Made once, at first use; a function-local static rather than
// std::call_once, which libstdc++ makes set thread-local state on every
// call, and every call with a log line in it (ZP_INFO) asks here.
LogState makeState() {
  LogState st;
  gethostname(st.host, sizeof(st.host) - 1);
  // Read through the parameter table; a bad value falls back to the
  // default here (logging cannot report its own errors).
  std::string level = envString("ZP_DEBUG"), subsys = envString("ZP_DEBUG_SUBSYS");
  std::string logFile = envString("ZP_DEBUG_FILE");
  // NCCL's habit: VERSION (and INFO, TRACE) print the version line once per process.
  const bool version = !strcasecmp(level.c_str(), "VERSION") || !strcasecmp(level.c_str(), "INFO") ||
                       !strcasecmp(level.c_str(), "TRACE");
  if (const char* lv = level.empty() ? nullptr : level.c_str()) {
    if (!strcasecmp(lv, "VERSION") || !strcasecmp(lv, "NONE") || !strcmp(lv, "0")) st.level = kLogNone;
    else if (!strcasecmp(lv, "WARN")) st.level = kLogWarn;
    else if (!strcasecmp(lv, "INFO")) st.level = kLogInfo;
    else if (!strcasecmp(lv, "TRACE")) st.level = kLogTrace;
  }
  if (!subsys.empty()) st.subsys = parseSubsys(subsys.c_str());
  if (!strcasecmp(envString("ZP_DEBUG_ERRORS").c_str(), "INFO")) st.errorLevel = kLogInfo;
  if (const char* file = logFile.empty() ? nullptr : logFile.c_str()) {
    std::string path;
    for (const char* p = file; *p; p++) {
      if (p[0] == '%' && p[1] == 'h') { path += st.host; p++; }
      else if (p[0] == '%' && p[1] == 'p') { path += std::to_string(getpid()); p++; }
      else path += *p;
    }
    // Opened without waiting: opening a FIFO for writing waits until
    // something reads it, which may be never (init hung there). A FIFO
    // or pipe that is read (/dev/stderr into a pipe) opens at once.
    const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    const int err = errno;
    FILE* f = nullptr;
    if (fd >= 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      if (!(f = fdopen(fd, "a"))) close(fd);
    }
    if (f) {
      setvbuf(f, nullptr, _IOLBF, 0);
      st.out = f;
    } else {
      fprintf(stderr, "%s:%d:%ld ZP WARN ZP_DEBUG_FILE=%s %s: logging to stderr instead\n", st.host, getpid(),
              (long)syscall(SYS_gettid), path.c_str(),
              err == ENXIO ? "is not a regular file, and nothing reads it (a FIFO or a socket)"
                           : (std::string("cannot be opened: ") + strerror(err)).c_str());
    }
  }
  if (version)
    fprintf(st.out, "%s:%d:%ld ZP INFO Zeppelin version %d.%d.%d\n", st.host, getpid(), (long)syscall(SYS_gettid),
            ZP_MAJOR, ZP_MINOR, ZP_PATCH);
  return st;
}

LogState& state() {
  static LogState st = makeState();
  return st;
}

thread_local std::string tlsLastError;

const char* levelName(LogLevel l) {
  switch (l) {
    case kLogWarn: return "WARN";
    case kLogInfo: return "INFO";
    case kLogTrace: return "TRACE";
    default: return "";
  }
}

void vlog(LogLevel level, const char* fmt, va_list ap) {
  LogState& st = state();
  char body[1024];
  vsnprintf(body, sizeof(body), fmt, ap);
  // One fprintf per line keeps lines from different threads whole.
  fprintf(st.out, "%s:%d:%ld ZP %s %s\n", st.host, getpid(), (long)syscall(SYS_gettid),
          levelName(level), body);
}

}  // namespace

namespace detail {
std::atomic<uint64_t> gLogGate{0};
uint64_t logGate() {
  const LogState& st = state();
  const uint64_t g = 1ull << 32 | (uint64_t)st.level << 40 | st.subsys;
  gLogGate.store(g, std::memory_order_relaxed);
  return g;
}
}  // namespace detail

void logMessage(LogLevel level, unsigned /*subsys*/, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, fmt, ap);
  va_end(ap);
}

zpResult_t failv(zpResult_t code, const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof(buf), fmt, ap);
  tlsLastError = buf;
  const LogLevel level = (LogLevel)state().errorLevel;
  if (logEnabled(level, kSubAll)) logMessage(level, kSubAll, "%s (%s)", buf, zpGetErrorString(code));
  return code;
}

zpResult_t fail(zpResult_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  zpResult_t r = failv(code, fmt, ap);
  va_end(ap);
  return r;
}

zpResult_t failFromException(const char* fn) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return fail(zpSystemError, "%s: out of memory", fn);
  } catch (const std::exception& e) {
    return fail(zpInternalError, "%s: unexpected exception: %s", fn, e.what());
  } catch (...) {
    return fail(zpInternalError, "%s: unexpected exception", fn);
  }
}

const char* lastError() { return tlsLastError.c_str(); }
void clearLastError() { tlsLastError.clear(); }

}  // namespace zp
