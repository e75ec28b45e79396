// Generator: a seeded, reproducible source of random numbers for rand/randn/randint.
//
// The stream is a Philox-style counter-based generator: a (seed, offset) pair fully
// determines every number drawn afterwards, so a generator state can be saved, sent and
// restored (state()/set_state()), and the same seed gives the same tensors on every
// machine. Gaussian values use the Box-Muller transform.
//
// default_generator() is the one process-wide instance used when a factory gets no
// generator; manual_seed() reseeds it.
//
// Thread-safety: every method locks the generator; concurrent draws are safe, and the
// order in which concurrent callers get their numbers is unspecified.
//
// Example:
//   Generator gen(42);
//   Tensor a = randn({3}, &gen);
//   gen.set_seed(42);
//   Tensor b = randn({3}, &gen);   // equal to a
#pragma once

#include <cstdint>
#include <mutex>

namespace gradwire {

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ULL) : seed_(seed) {}

  void set_seed(uint64_t seed);
  uint64_t seed() const;
  struct State {
    uint64_t seed;
    uint64_t offset;
  };
  State state() const;
  void set_state(State s);

  // Reserves `count` 128-bit blocks of the stream and returns the offset of the first;
  // kernels then compute block i as philox(seed, offset + i) independently.
  uint64_t reserve(uint64_t count);

  // One 128-bit Philox4x32-10 block for (seed, counter), as four 32-bit words.
  static void philox(uint64_t seed, uint64_t counter, uint32_t out[4]);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace gradwire
