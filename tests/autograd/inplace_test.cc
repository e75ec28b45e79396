// In-place operations and views under autograd: version checks, refused cases (with the
// errors docs/autograd.md describes) and rebased history.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

Tensor leaf(std::vector<double> values) {
  return tensor<double>(values).set_requires_grad(true);
}
std::vector<double> vec(const Tensor& t) {
  return t.to_vector<double>();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(InPlace, LeafRequiringGradIsRefused) {
  Tensor a = leaf({1, 2});
  std::string msg = error_of([&] { a.add_(1.0); });
  EXPECT_NE(msg.find("leaf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("add_"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { a.mul_(2.0); }), "");
  EXPECT_NE(error_of([&] { a.copy_(tensor<double>({3, 4})); }), "");
  EXPECT_NE(error_of([&] { a.zero_(); }), "");
  EXPECT_EQ(vec(a), (std::vector<double>{1, 2}));  // refused before writing
}

TEST(InPlace, ModifyingASavedTensorIsDetectedAtBackward) {
  Tensor a = leaf({1, 2});
  Tensor h = a * 2.0;
  Tensor y = sum(h * h);  // MulBackward saves h
  h.add_(1.0);
  std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("modified by an inplace operation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MulBackward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("version"), std::string::npos) << msg;
}

TEST(InPlace, SavedOutputModifiedIsDetected) {
  Tensor a = leaf({0.5, 1.0});
  Tensor e = exp(a);  // ExpBackward saves its output
  Tensor y = sum(e);
  e.mul_(2.0);
  EXPECT_NE(error_of([&] { sum(e).backward(); }).find("ExpBackward"), std::string::npos);
  (void)y;
}

TEST(InPlace, RebasedHistoryGivesCorrectGradients) {
  Tensor a = leaf({1, 2});
  Tensor h = a * 3.0;
  h.mul_(a);     // h = 3a^2
  h.add_(a, 2);  // h = 3a^2 + 2a
  EXPECT_EQ(h.grad_fn()->name(), "AddBackward");
  sum(h).backward();
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{8, 14}));  // 6a + 2
}

TEST(InPlace, WriteThroughARecordedViewIsRefused) {
  Tensor a = leaf({1, 2, 3, 4});
  Tensor h = a * 1.0;
  Tensor v = h.narrow(0, 0, 2);
  std::string msg = error_of([&] { v.mul_(2.0); });
  EXPECT_NE(msg.find("view"), std::string::npos) << msg;
}

TEST(InPlace, StaleViewIsRefused) {
  Tensor a = leaf({1, 2, 3, 4});
  Tensor h = a * 1.0;
  Tensor v = h.narrow(0, 1, 2);
  h.mul_(2.0);  // v's values changed, but its history says narrow(h before the write)
  std::string msg = error_of([&] { sum(v * 1.0).backward(); });
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;
  // Taking the view again after the write is fine.
  sum(h.narrow(0, 1, 2)).backward();
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{0, 2, 2, 0}));
}

TEST(InPlace, UntrackedAliasIsRefused) {
  // buf has no autograd state, so a view of it taken before the write is untracked: writing
  // a gradient-requiring value through it would lose gradients silently.
  Tensor w = leaf({5, 6});
  Tensor buf = zeros({4}, kFloat64);
  Tensor part = buf.narrow(0, 0, 2);
  std::string msg = error_of([&] { part.copy_(w); });
  EXPECT_NE(msg.find("shared"), std::string::npos) << msg;
  // A tensor that owns its storage may take a gradient-requiring value.
  Tensor own = zeros({2}, kFloat64);
  own.copy_(w);
  EXPECT_TRUE(own.requires_grad());
  sum(own * own).backward();
  EXPECT_EQ(vec(w.grad()), (std::vector<double>{10, 12}));
}

TEST(InPlace, UnderNoGradAnythingGoes) {
  Tensor a = leaf({1, 2});
  {
    autograd::NoGradGuard no_grad;
    a.mul_(3.0);
    a.narrow(0, 0, 1).fill_(0.0);
  }
  EXPECT_EQ(vec(a), (std::vector<double>{0, 6}));
  EXPECT_TRUE(a.is_leaf());
  sum(a * a).backward();
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{0, 12}));
}

TEST(InPlace, AsStridedOfExpandedInputIsAClearError) {
  Tensor a = leaf({1, 2});
  Tensor e = a.expand({3, 2});
  Tensor s = e.as_strided({2}, {1}, 0);
  std::string msg = error_of([&] { sum(s).backward(); });
  EXPECT_NE(msg.find("as_strided"), std::string::npos) << msg;
}

}  // namespace
}  // namespace gradwire
