#include "gradwire/tensor/generator.h"

namespace gradwire {

void Generator::set_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

Generator::State Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return State{seed_, offset_};
}

void Generator::set_state(State s) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = s.seed;
  offset_ = s.offset;
}

uint64_t Generator::reserve(uint64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t first = offset_;
  offset_ += count;
  return first;
}

void Generator::philox(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  // Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2,
  // 3", SC'11): the counter is the block index, the key the seed.
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

Generator& default_generator() {
  static Generator gen;
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().set_seed(seed); }

}  // namespace gradwire
