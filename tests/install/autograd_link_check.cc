// A program that uses autograd only through Tensor's own methods, so it references no
// symbol of libgradwire_autograd. It must still get gradients: the autograd target's link
// options keep the library (and the registrar that installs its hooks) in the program.
#include <gradwire/tensor/factory.h>
#include <gradwire/tensor/ops.h>

#include <cstdio>

int main() {
  using namespace gradwire;
  try {
    Tensor x = tensor<double>({1.0, 2.0, 3.0});
    x.set_requires_grad(true);
    Tensor y = sum(x * x);  // dy/dx = 2x
    y.backward();
    const std::vector<double> g = x.grad().to_vector<double>();
    if (g != std::vector<double>{2.0, 4.0, 6.0}) {
      std::fprintf(stderr, "wrong gradient\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "autograd link check: %s\n", e.what());
    return 1;
  }
  std::printf("autograd is linked and recording\n");
  return 0;
}
