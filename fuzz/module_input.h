// What the fuzz targets of rref/'s and dist_autograd/'s messages share: three agents in one
// process (ranks as threads, as the modules' own tests run them), started once and kept for
// the life of the process; and the input format, a sequence of messages:
//   [flags] [payload length] [payload bytes] [arguments]...
// where the flags say which worker sends the message, how many arguments follow (each
// built from the next input bytes, see read_value) and what the target does with the
// message (see the targets). fuzz_seeds writes inputs of this format with write_message.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::fuzz {

// Reads the input front to back; past its end every read gives 0.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  std::string bytes(size_t n) {
    std::string s;
    while (n-- > 0 && p_ < end_)
      s.push_back(static_cast<char>(*p_++));
    return s;
  }
  bool empty() const { return p_ >= end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// One message of an input.
struct Message {
  uint8_t flags = 0;
  std::string payload;
  std::vector<rpc::Value> args;
};

inline constexpr int kWorkers = 3;
inline constexpr size_t kMaxMessages = 16;
inline constexpr int kMaxArgs = 4;

// A worker id inside the group, for ids and descriptors (a few bytes reach outside it).
inline uint64_t minted(uint8_t worker, uint8_t counter) {
  return (uint64_t{worker % 4u} << 48) | counter;
}

// An argument: the values these handlers meet (gradients, a creation's arguments, and
// references, which the rref interceptor accounts for on arrival).
inline rpc::Value read_value(Input& in) {
  static const char* const kTypes[] = {"Tensor", "int", "Counter", ""};
  switch (in.byte() % 8) {
    case 0:
      return rpc::Value();
    case 1:
      return rpc::Value(static_cast<int64_t>(static_cast<int8_t>(in.byte())));
    case 2:
      return rpc::Value(in.bytes(in.byte() % 8));
    case 3:
    case 4: {
      // Small tensors of a few shapes and dtypes: gradients that fit or do not.
      static const DType kDTypes[] = {kFloat32, kFloat64, kInt64, kFloat32};
      const DType dtype = kDTypes[in.byte() % 4];
      Shape shape;
      const int dims = in.byte() % 3;
      for (int i = 0; i < dims; ++i)
        shape.push_back(in.byte() % 4);
      return rpc::Value(ones(shape, TensorOptions{dtype}));
    }
    case 5:
    case 6: {
      const int32_t owner = in.byte() % 4;
      const uint64_t rref = minted(in.byte(), in.byte());
      const uint64_t fork = minted(in.byte(), in.byte());
      return rpc::Value(rpc::RRefDescriptor{owner, rref, fork, kTypes[in.byte() % 4]});
    }
    default: {
      rpc::Value::List items;
      const int n = in.byte() % 3;
      for (int i = 0; i < n; ++i)
        items.push_back(in.byte() % 2 == 0 ? rpc::Value(int64_t{i}) : rpc::Value(ones({2})));
      return rpc::Value::list(std::move(items));
    }
  }
}

// The messages of an input: flags bits 2-4 give the number of arguments (at most kMaxArgs).
inline std::vector<Message> split(const uint8_t* data, size_t size) {
  Input in(data, size);
  std::vector<Message> out;
  while (!in.empty() && out.size() < kMaxMessages) {
    Message m;
    m.flags = in.byte();
    m.payload = in.bytes(in.byte());
    const int n = ((m.flags >> 2) & 7) % (kMaxArgs + 1);
    for (int i = 0; i < n; ++i)
      m.args.push_back(read_value(in));
    out.push_back(std::move(m));
  }
  return out;
}

// The encoding of one message with no arguments (for fuzz_seeds); `flags` must say 0.
inline std::string write_message(uint8_t flags, const std::string& payload) {
  return std::string(1, static_cast<char>(flags)) +
         std::string(1, static_cast<char>(payload.size())) + payload;
}

// Waits, at most `limit`, until `settled(why)` holds; then traps, naming `what` and why. The
// modules' bookkeeping has no event to wait on, so it is polled every millisecond.
template <typename Settled>
inline void expect_settled(const char* what, std::chrono::milliseconds limit, Settled settled) {
  std::string why;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!settled(why)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "fuzz: %s state left after the input ended: %s\n", what, why.c_str());
      __builtin_trap();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Agents "w0" .. "w2" on one store, started concurrently (each waits for all), never shut
// down: they serve every input of the run.
inline std::vector<std::shared_ptr<rpc::RpcAgent>> start_agents(rpc::Registry& registry) {
  using namespace std::chrono_literals;
  rpc::AgentOptions options;
  options.registry = &registry;
  // A reply a hostile message never gets (a creation it names never comes) fails the call
  // soon, so that the waits of a run stay short.
  options.rpc_timeout = 5s;
  options.join_timeout = 30s;
  options.num_worker_threads = 4;
  options.mpt_lanes = 1;
  options.transports = {"tcp"};
  auto store = std::make_shared<c10d::HashStore>(30s);
  std::vector<std::shared_ptr<rpc::RpcAgent>> agents(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      try {
        agents[r] =
            rpc::make_tensorpipe_agent("w" + std::to_string(r), r, kWorkers, store, options);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz: agent %d did not start: %s\n", r, e.what());
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (const auto& a : agents) {
    if (a == nullptr) __builtin_trap();
  }
  return agents;
}

}  // namespace gradwire::fuzz
