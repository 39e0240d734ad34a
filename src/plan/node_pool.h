// NodePool and Pooled: the nodes of a tree container (std::set, std::map)
// kept when freed for the next it makes, rather than a malloc and a free
// each (the planner's schedules insert and erase thousands per candidate).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace zp::plan {

// The nodes of one container: blocks of the one size it asks for one at a
// time (the first size asked for; any other is not kept), kept when it frees
// them for the next it makes.
class NodePool {
 public:
  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() {
    for (void* p : free_) ::operator delete(p);
  }
  void* take(size_t bytes) {
    if (!bytes_) bytes_ = bytes;
    if (bytes != bytes_ || free_.empty()) return ::operator new(bytes);
    void* p = free_.back();
    free_.pop_back();
    return p;
  }
  void give(void* p, size_t bytes) {
    if (bytes == bytes_) free_.push_back(p);
    else ::operator delete(p);
  }

 private:
  size_t bytes_ = 0;
  std::vector<void*> free_;
};

// A container's allocator drawing its nodes from a NodePool (which must
// outlive the container).
template <class T>
struct Pooled {
  using value_type = T;
  NodePool* pool;
  explicit Pooled(NodePool* p) : pool(p) {}
  template <class U>
  Pooled(const Pooled<U>& o) : pool(o.pool) {}
  T* allocate(size_t n) { return static_cast<T*>(n == 1 ? pool->take(sizeof(T)) : ::operator new(n * sizeof(T))); }
  void deallocate(T* p, size_t n) {
    if (n == 1) pool->give(p, sizeof(T));
    else ::operator delete(p);
  }
  template <class U>
  bool operator==(const Pooled<U>& o) const { return pool == o.pool; }
  template <class U>
  bool operator!=(const Pooled<U>& o) const { return pool != o.pool; }
};

}  // namespace zp::plan
