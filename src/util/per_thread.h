// State of one thread that every call touches (the open group, the handle
// cache). A `thread_local` object of a shared library is reached through a
// call to __tls_get_addr on each access, and one with a constructor through
// a guard function as well: a dozen such accesses were an eighth of a small
// send/recv's instructions. Here each thread's state is reached through one
// pointer of the initial-exec model (a read at a fixed offset from the
// thread pointer, no call); the state itself lives on the heap. The pointer
// takes 8 bytes of the static TLS that glibc keeps spare for libraries that
// are loaded later (dlopen, as Python loads this one). Each user names its
// own type (a struct of its own, local to a function if need be): the type
// is what tells two users' states apart.
#pragma once

namespace zp {

template <class T>
class PerThread {
 public:
  static T& get() {
    T* s = ptr_;
    if (__builtin_expect(s != nullptr, 1)) return *s;
    return make();
  }

 private:
  // Frees the state when the thread ends (and clears the pointer, in case a
  // later thread-exit destructor calls in).
  struct Owner {
    T* state = nullptr;
    ~Owner() {
      ptr_ = nullptr;
      delete state;
    }
  };
  static T& make() {
    static thread_local Owner owner;
    if (!owner.state) owner.state = new T();
    return *(ptr_ = owner.state);
  }
  static thread_local T* ptr_ __attribute__((tls_model("initial-exec")));
};

template <class T>
thread_local T* PerThread<T>::ptr_ = nullptr;

}  // namespace zp
