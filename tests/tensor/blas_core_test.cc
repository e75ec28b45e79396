// blas_core (parallel.h): the name of the kernel set OpenBLAS runs the products with. Each
// case runs this test binary again in a child process with the environment it needs, since
// OpenBLAS makes its choice when it loads, before any test code runs. The child prints
// blas_core() and the product of two small matrices, checked against values worked out by
// hand, so that the kernels named are also the kernels that ran.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/parallel.h"
#include "support/command.h"

namespace gradwire {
namespace {

// Run only as the child of the cases below.
TEST(BlasCoreChild, DISABLED_Report) {
  // [[1, 2, 3], [4, 5, 6]] x [[7, 8], [9, 10], [11, 12]] = [[58, 64], [139, 154]]
  const Tensor a = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = tensor<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  const std::vector<float> c = matmul(a, b).to_vector<float>();
  std::printf("blas_core=%s product=%g,%g,%g,%g\n", blas_core().c_str(), c[0], c[1], c[2], c[3]);
}

struct Child {
  std::string core;
  std::string product;
  std::string output;
};

// This test binary's path (resolved here: in the shell's command, /proc/self/exe would be
// the shell's own).
std::string self_path() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Runs the child with `env` (a prefix for the shell: assignments, or `env -u NAME`).
Child run_child(const std::string& env) {
  int status = 0;
  Child child;
  child.output = test::run_command(env + " '" + self_path() +
                                       "' --gtest_also_run_disabled_tests "
                                       "--gtest_filter=BlasCoreChild.DISABLED_Report",
                                   status);
  EXPECT_EQ(status, 0) << child.output;
  const size_t at = child.output.find("blas_core=");
  if (at == std::string::npos) {
    ADD_FAILURE() << "the child printed no report:\n" << child.output;
    return child;
  }
  const size_t end = child.output.find(' ', at);
  child.core = child.output.substr(at + 10, end - at - 10);
  const size_t p = child.output.find("product=", end);
  child.product = child.output.substr(p + 8, child.output.find('\n', p) - p - 8);
  return child;
}

TEST(BlasCore, NamesTheKernelSetOfThisProcess) {
  const std::string core = blas_core();
  EXPECT_FALSE(core.empty());
  // What this process runs with is what a fresh process with the same environment reports.
  EXPECT_EQ(run_child("").core, core);
}

TEST(BlasCore, AKernelSetChosenThroughTheEnvironmentIsKept) {
  // Haswell's kernels need AVX2 and FMA; OpenBLAS falls back to an older set without them.
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "this CPU has no AVX2 and FMA for OpenBLAS's Haswell kernels";
  }
  const Child child = run_child("OPENBLAS_CORETYPE=Haswell");
  EXPECT_EQ(child.core, "Haswell") << child.output;
  EXPECT_EQ(child.product, "58,64,139,154") << child.output;
}

}  // namespace
}  // namespace gradwire
