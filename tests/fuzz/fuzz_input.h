// Reads a fuzzer's input as a stream of little values; past the end, zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zpfuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  template <class T>
  T take() {
    T v{};
    size_t k = n_ < sizeof(T) ? n_ : sizeof(T);
    memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  // A value in [0, bound) (bound >= 1).
  uint32_t below(uint32_t bound) { return take<uint32_t>() % bound; }
  size_t left() const { return n_; }
  const uint8_t* rest() const { return p_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace zpfuzz
