// A callable passed down a call and not kept: two words, no allocation and
// no type-erasure manager, unlike std::function (whose making and calling
// were a measurable part of a small message's call). The callable must
// outlive the FunctionRef: pass a lambda straight to the parameter.
#pragma once

#include <type_traits>
#include <utility>

namespace zp {

template <class Sig>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  FunctionRef() = default;
  FunctionRef(std::nullptr_t) {}  // NOLINT: "no callable", as std::function's nullptr
  template <class F, class = std::enable_if_t<!std::is_same<std::decay_t<F>, FunctionRef>::value>>
  FunctionRef(F&& f)  // NOLINT: converts from any callable, as std::function does
      : obj_((void*)std::addressof(f)), call_([](void* o, Args... a) -> R {
          return (*(std::remove_reference_t<F>*)o)(std::forward<Args>(a)...);
        }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }
  explicit operator bool() const { return call_ != nullptr; }

 private:
  void* obj_ = nullptr;
  R (*call_)(void*, Args...) = nullptr;
};

}  // namespace zp
