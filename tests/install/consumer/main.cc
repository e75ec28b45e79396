// A program outside the gradwire tree, built against the installed package.
#include <gradwire/gradwire.h>

#include <cstdio>

int main() {
  using namespace gradwire;
  Tensor a = arange(6, kFloat32).reshape({2, 3});
  Tensor b = ones({3}, kFloat32);
  Tensor c = sum(a + b);  // (0+..+5) + 6 = 21
  if (c.item<double>() != 21.0) {
    std::fprintf(stderr, "consumer: expected 21, got %f\n", c.item<double>());
    return 1;
  }
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{});
  Future<int> f = pool->submit([] { return 7; });
  if (f.get(std::chrono::seconds(10)) != 7) return 1;
  std::printf("consumer: gradwire %s works (CUDA %d)\n", GRADWIRE_VERSION_STRING,
              GRADWIRE_HAS_CUDA);
  return 0;
}
