// Tensor printing. Expected strings are written out by hand following PyTorch's rules
// (torch/_tensor_str.py, default options: precision 4, threshold 1000, edge items 3,
// line width 80), i.e. what `print(torch.tensor(...))` shows, with dtypes spelled the
// gradwire way ("dtype=float64").
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

TEST(Print, MatrixWithDtypeSuffix) {
  EXPECT_EQ(tensor<double>({1, 2, 3, 4}, {2, 2}).to_string(),
            "tensor([[1., 2.],\n"
            "        [3., 4.]], dtype=float64)");
}

TEST(Print, DefaultDtypesHaveNoSuffix) {
  EXPECT_EQ(arange(5).to_string(), "tensor([0, 1, 2, 3, 4])");
  EXPECT_EQ(tensor<bool>({true, false}).to_string(), "tensor([ True, False])");
  EXPECT_EQ(tensor<float>({1.5f, -2.25f, 3.0f}).to_string(), "tensor([ 1.5000, -2.2500,  3.0000])");
}

TEST(Print, OtherDtypesNameThemselves) {
  EXPECT_EQ(tensor<int32_t>({1, -2, 30}).to_string(), "tensor([ 1, -2, 30], dtype=int32)");
  EXPECT_EQ(tensor<uint8_t>({0, 255}).to_string(), "tensor([  0, 255], dtype=uint8)");
  EXPECT_EQ(tensor<float>({0.5f, 1.25f}).to(kFloat16).to_string(),
            "tensor([0.5000, 1.2500], dtype=float16)");
  EXPECT_EQ(tensor<float>({-1, 2}).to(kBFloat16).to_string(), "tensor([-1.,  2.], dtype=bfloat16)");
  // int64 beyond 2^53 prints exactly.
  EXPECT_EQ(tensor<int64_t>({9007199254740993LL}).to_string(), "tensor([9007199254740993])");
}

TEST(Print, ZeroDimTensors) {
  EXPECT_EQ(scalar_tensor(3.5).to_string(), "tensor(3.5000)");
  EXPECT_EQ(scalar_tensor(2.0).to_string(), "tensor(2.)");
  EXPECT_EQ(scalar_tensor(7).to_string(), "tensor(7)");
  EXPECT_EQ(scalar_tensor(true).to_string(), "tensor(True)");
  EXPECT_EQ(scalar_tensor(2.5, kFloat64).to_string(), "tensor(2.5000, dtype=float64)");
  EXPECT_EQ(scalar_tensor(-3, kInt32).to_string(), "tensor(-3, dtype=int32)");
}

TEST(Print, EmptyTensors) {
  EXPECT_EQ(empty({0}).to_string(), "tensor([])");
  EXPECT_EQ(empty({0, 3}).to_string(), "tensor([], size=(0, 3))");
  // No values to tell int64 from the default: the dtype is shown.
  EXPECT_EQ(empty({0}, kInt64).to_string(), "tensor([], dtype=int64)");
  EXPECT_EQ(empty({2, 0}, kBool).to_string(), "tensor([], size=(2, 0), dtype=bool)");
}

TEST(Print, FloatModes) {
  // Non-integers with a smallest magnitude below 1e-4: scientific.
  EXPECT_EQ(tensor<double>({1e-5, 1.0}).to_string(),
            "tensor([1.0000e-05, 1.0000e+00], dtype=float64)");
  // Integers whose magnitudes differ by more than 1000x: scientific too.
  EXPECT_EQ(tensor<float>({1, 2000}).to_string(), "tensor([1.0000e+00, 2.0000e+03])");
  EXPECT_EQ(tensor<float>({1e9f, 2e9f}).to_string(), "tensor([1.0000e+09, 2.0000e+09])");
  // Integers, right-aligned counting the '.'.
  EXPECT_EQ(tensor<float>({-10, 5}).to_string(), "tensor([-10.,   5.])");
  EXPECT_EQ(tensor<float>({0, 0}).to_string(), "tensor([0., 0.])");
  // Fixed with four decimals.
  EXPECT_EQ(tensor<float>({0.001f, 0.5f}).to_string(), "tensor([0.0010, 0.5000])");
  EXPECT_EQ(tensor<float>({-1.5f, 10.25f, 3, 4}, {2, 2}).to_string(),
            "tensor([[-1.5000, 10.2500],\n"
            "        [ 3.0000,  4.0000]])");
}

TEST(Print, NanAndInfinity) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  // Only nonzero finite values choose the mode and the width.
  EXPECT_EQ(tensor<float>({nan, 1, inf}).to_string(), "tensor([nan, 1., inf])");
  EXPECT_EQ(tensor<float>({-inf, 0.5f}).to_string(), "tensor([  -inf, 0.5000])");
  EXPECT_EQ(tensor<float>({nan}).to_string(), "tensor([nan])");
}

TEST(Print, LongRowsWrapAt80Columns) {
  // Width 2 plus ", ": (80 - 7) / 4 = 18 elements per line.
  EXPECT_EQ(arange(30).to_string(),
            "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
            "        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])");
}

TEST(Print, MatrixRowsWrapWithDeeperIndent) {
  // Rows start at column 8: (80 - 8) / (4 + 2) = 12 elements per line, continuation lines
  // indented one past the row's bracket.
  EXPECT_EQ(arange(1000, 1026).reshape({2, 13}).to_string(),
            "tensor([[1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011,\n"
            "         1012],\n"
            "        [1013, 1014, 1015, 1016, 1017, 1018, 1019, 1020, 1021, 1022, 1023, 1024,\n"
            "         1025]])");
}

TEST(Print, SuffixWrapsExactlyPastTheLineWidth) {
  // A one-line body of 63 characters counts as 65 (PyTorch's measure); ", dtype=float64"
  // then ends at column 80, which still fits, while ", dtype=bfloat16" would reach 81.
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5};
  const std::string body = "tensor([1., 2., 3., 4., 5., 6., 7., 8., 9., 1., 2., 3., 4., 5.]";
  ASSERT_EQ(body.size(), 63u);
  EXPECT_EQ(tensor<double>(v).to_string(), body + ", dtype=float64)");
  EXPECT_EQ(tensor<double>(v).to(kBFloat16).to_string(), body + ",\n       dtype=bfloat16)");
}

TEST(Print, SuffixMovesToItsOwnLineWhenTooLong) {
  Tensor t = arange(1000, 1012).to(kInt32);
  EXPECT_EQ(t.to_string(),
            "tensor([1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011],\n"
            "       dtype=int32)");
}

TEST(Print, SummarizesAboveAThousandElements) {
  EXPECT_EQ(arange(1000).to_string().find("..."), std::string::npos);
  EXPECT_EQ(arange(2000).to_string(), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  // 2-d: the first and last three rows, and within each row (longer than 2 * 3) the first
  // and last three columns; the width comes from the shown values (1099: 4 digits).
  const Tensor m = arange(1100).reshape({110, 10});
  auto row = [](int64_t r, bool cut) {
    std::string s = "[";
    for (int64_t c = 0; c < 10; ++c) {
      if (cut && c >= 3 && c < 7) {
        if (c == 3) s += " ...";
        if (c == 3) s += ", ";
        continue;
      }
      std::string v = std::to_string(r * 10 + c);
      s += std::string(4 - v.size(), ' ') + v;
      if (c < 9) s += ", ";
    }
    return s + "]";
  };
  std::string want = "tensor([";
  for (int64_t r : {0, 1, 2})
    want += row(r, true) + ",\n        ";
  want += "...,\n        ";
  want += row(107, true) + ",\n        " + row(108, true) + ",\n        " + row(109, true) + "])";
  EXPECT_EQ(m.to_string(), want);
  // The mode is chosen from the shown values only: the hidden 1e10 does not force
  // scientific notation.
  Tensor f = full({2000}, 1.5);
  f.select(0, 1000).fill_(1e10);
  EXPECT_EQ(f.to_string(), "tensor([1.5000, 1.5000, 1.5000,  ..., 1.5000, 1.5000, 1.5000])");
}

TEST(Print, ThreeDimsAndViews) {
  EXPECT_EQ(zeros({2, 2, 2}, kInt64).to_string(),
            "tensor([[[0, 0],\n"
            "         [0, 0]],\n"
            "\n"
            "        [[0, 0],\n"
            "         [0, 0]]])");
  EXPECT_EQ(tensor<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}).t().to_string(),
            "tensor([[1, 4],\n"
            "        [2, 5],\n"
            "        [3, 6]])");
  EXPECT_EQ(arange(10).slice(0, 1, 10, 3).to_string(), "tensor([1, 4, 7])");
  EXPECT_EQ(tensor<int64_t>({5}).expand({3}).to_string(), "tensor([5, 5, 5])");
}

TEST(Print, StreamShapeAndUndefined) {
  const Tensor t = tensor<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  std::ostringstream os;
  os << t;
  EXPECT_EQ(os.str(), t.to_string());
  EXPECT_EQ(t.shape_string(), "[2, 3]");
  EXPECT_EQ(scalar_tensor(1).shape_string(), "[]");
  EXPECT_EQ(Tensor().to_string(), "Tensor(undefined)");
  std::ostringstream os2;
  os2 << Tensor();
  EXPECT_EQ(os2.str(), "Tensor(undefined)");
}

TEST(Print, DeviceSuffix) {
  if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(tensor<float>({1, 2}).to(Device::cuda(0)).to_string(),
            "tensor([1., 2.], device='cuda:0')");
}

}  // namespace
}  // namespace gradwire
