#include "src/util/strings.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace zp {

std::string vstrprintf(const char* fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string s((size_t)n, '\0');
  vsnprintf(&s[0], (size_t)n + 1, fmt, ap);
  return s;
}

std::string strprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrprintf(fmt, ap);
  va_end(ap);
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && isspace((unsigned char)s[b])) b++;
  while (e > b && isspace((unsigned char)s[e - 1])) e--;
  return s.substr(b, e - b);
}

bool parseInt(const std::string& text, long long lo, long long hi, long long* out) {
  if (text.empty()) return false;
  const char* begin = text.c_str();
  const char* end = begin + text.size();
  long long v = 0;
  auto r = std::from_chars(begin, end, v, 10);
  if (r.ec != std::errc() || r.ptr != end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parseInt(const std::string& text, int lo, int hi, int* out) {
  long long v = 0;
  if (!parseInt(text, (long long)lo, (long long)hi, &v)) return false;
  *out = (int)v;
  return true;
}

bool parseDouble(const std::string& text, double lo, double hi, double* out) {
  if (text.empty()) return false;
  const char* begin = text.c_str();
  const char* end = begin + text.size();
  double v = 0;
  auto r = std::from_chars(begin, end, v, std::chars_format::general);
  if (r.ec != std::errc() || r.ptr != end || !std::isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parseSize(const std::string& text, size_t* out) {
  if (text.empty() || !isdigit((unsigned char)text[0])) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text.c_str(), &end, 10);
  if (errno || end == text.c_str()) return false;
  unsigned shift = 0;
  if (*end) {
    switch (*end) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      default: return false;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return false;
  }
  if (shift && v > (~0ULL >> shift)) return false;
  *out = (size_t)(v << shift);
  return true;
}

bool parseBitsPerSec(const std::string& text, double* bitsPerSec) {
  std::string t = trim(text);
  if (t.empty()) return false;
  const char* begin = t.c_str();
  const char* end = begin + t.size();
  double v = 0;
  auto r = std::from_chars(begin, end, v, std::chars_format::general);
  if (r.ec != std::errc() || !std::isfinite(v) || v < 0) return false;
  std::string unit(r.ptr, end);
  for (char& c : unit) c = (char)tolower((unsigned char)c);
  struct Unit {
    const char* name;
    double factor;
  };
  // clang-format off
  static const Unit kUnits[] = {
      {"", 1},           {"bit", 1},         {"kbit", 1e3},          {"mbit", 1e6},
      {"gbit", 1e9},     {"tbit", 1e12},     {"kibit", 1024.0},      {"mibit", 1048576.0},
      {"gibit", 1073741824.0},               {"tibit", 1099511627776.0},
      {"bps", 8},        {"kbps", 8e3},      {"mbps", 8e6},          {"gbps", 8e9},
      {"tbps", 8e12},    {"kibps", 8 * 1024.0},                      {"mibps", 8 * 1048576.0},
      {"gibps", 8 * 1073741824.0},           {"tibps", 8 * 1099511627776.0},
  };
  // clang-format on
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      double bits = v * u.factor;
      if (!std::isfinite(bits)) return false;
      *bitsPerSec = bits;
      return true;
    }
  }
  return false;
}

std::string formatBitsPerSec(double bps) {
  if (!(bps > 0)) return "unknown";
  static const struct {
    double factor;
    const char* unit;
  } kUnits[] = {{1e12, "Tbit/s"}, {1e9, "Gbit/s"}, {1e6, "Mbit/s"}, {1e3, "kbit/s"}};
  for (const auto& u : kUnits) {
    if (bps >= u.factor) return strprintf("%.4g %s", bps / u.factor, u.unit);
  }
  return strprintf("%.4g bit/s", bps);
}

bool firstHostOfList(const std::string& list, std::string* host) {
  std::string out;
  size_t i = 0;
  while (i < list.size() && list[i] != ',') {
    if (list[i] == ']') return false;
    if (list[i] != '[') {
      out += list[i++];
      continue;
    }
    // A bracket group "[01-04,07]": its first entry's first number, as written
    // (zero padding is part of the host name).
    size_t close = list.find(']', i);
    if (close == std::string::npos) return false;
    std::string group = list.substr(i + 1, close - i - 1);
    std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) return false;
    if (group.find('[') != std::string::npos) return false;
    out += first;
    i = close + 1;
  }
  if (out.empty()) return false;
  *host = out;
  return true;
}

}  // namespace zp
