// Spare nodes of a std::unordered_map (C++17 node handles), so that a map whose size stays
// about the same allocates nothing per insert: Erase keeps the erased entry's node (up to
// kKeep of them) and Insert reuses one. The handoff's maps (handoff.h) take an entry per
// call and give it back when the call is answered: without spares, one malloc and one free
// per map per call on the completion-queue and answer threads. Not thread-safe: the caller
// holds the map's lock.
#ifndef TRITON_MP_NATIVE_NODE_POOL_H_
#define TRITON_MP_NATIVE_NODE_POOL_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace triton_mp {

template <class Map, size_t kKeep = 256>
class NodePool {
 public:
  NodePool() { spare_.reserve(kKeep); }

  // map[key] = value for a key not in the map (as emplace), in a spare node when one is kept.
  template <class V>
  void Insert(Map* map, const typename Map::key_type& key, V&& value) {
    if (spare_.empty()) {
      map->emplace(key, std::forward<V>(value));
      return;
    }
    typename Map::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = key;
    node.mapped() = std::forward<V>(value);
    map->insert(std::move(node));
  }

  // map.erase(it), the node kept for the next Insert while fewer than kKeep are.
  void Erase(Map* map, typename Map::iterator it) {
    typename Map::node_type node = map->extract(it);
    if (spare_.size() < kKeep) spare_.push_back(std::move(node));
  }

 private:
  std::vector<typename Map::node_type> spare_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_NODE_POOL_H_
