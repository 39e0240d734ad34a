// Small string and number utilities shared by every layer (the library, the
// tools, the launcher and the benchmarks). Depends on nothing of Zeppelin's.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <string>

namespace zp {

// printf into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrprintf(const char* fmt, va_list ap);

// Leading and trailing white space removed.
std::string trim(const std::string& s);

// A whole decimal integer in [lo, hi]; false on anything else (signs other
// than a leading '-', spaces, suffixes, overflow).
bool parseInt(const std::string& text, long long lo, long long hi, long long* out);
// Convenience for int-sized values.
bool parseInt(const std::string& text, int lo, int hi, int* out);

// A whole finite decimal number in [lo, hi] (locale-independent).
bool parseDouble(const std::string& text, double lo, double hi, double* out);

// A byte size: digits with an optional K, M or G suffix, powers of two
// (KiB, MB, ... accepted as the same). False on garbage or overflow.
bool parseSize(const std::string& text, size_t* out);

// A rate: a number with an optional unit, tc's notation (bit, kbit, mbit,
// gbit, tbit, kibit..., bps = bytes/s, kbps, ..., gibps...), case-insensitive;
// no unit means bits/s.
bool parseBitsPerSec(const std::string& text, double* bitsPerSec);
// "1.25 Gbit/s", or "unknown" for 0.
std::string formatBitsPerSec(double bitsPerSec);

// The first host of a Slurm host list, whose compressed form names ranges in
// brackets: "node[01-04,07],gpu3" -> "node01", "rack[1-2]-n[5-6]" ->
// "rack1-n5". False on an empty or malformed list (unbalanced brackets, an
// empty or non-numeric range).
bool firstHostOfList(const std::string& hostlist, std::string* host);

}  // namespace zp
