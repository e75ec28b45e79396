// The examples' data readers (examples/common/data.h): CSV and MNIST IDX files, good and
// bad, written to a temporary directory.
#include "../../examples/common/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace gradwire::examples {
namespace {

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gradwire-data-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  template <typename F>
  std::string error_of(F&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "(no error)";
  }
  std::filesystem::path dir_;
};

TEST_F(DataFiles, CsvWithAHeaderBlankLinesAndLabels) {
  const std::string path = write("ok.csv", "a,b,label\n1.5,-2,0\n\n3,4e-1,2\n0,0,1\n");
  Dataset d = load_csv(path);
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.features(), 2);
  EXPECT_EQ(d.classes, 3);
  EXPECT_FLOAT_EQ(d.x.data<float>()[0], 1.5f);
  EXPECT_FLOAT_EQ(d.x.data<float>()[3], 0.4f);
  EXPECT_EQ(d.y.data<int64_t>()[1], 2);
  auto [train, test] = split(d, 0.34, 1);
  EXPECT_EQ(train.size() + test.size(), 3);
  EXPECT_EQ(test.size(), 1);
}

TEST_F(DataFiles, AHeaderWithSomeNumericFieldsIsAHeader) {
  // pandas writes its index column unnamed and names columns by number.
  for (const char* header : {",0,1,label", "id,0,1,label", "0,1,2,y"}) {
    const std::string path = write("pandas.csv", std::string(header) + "\n0,1.5,-2,0\n1,3,4,1\n");
    Dataset d = load_csv(path);
    ASSERT_EQ(d.size(), 2) << header;
    EXPECT_EQ(d.features(), 3) << header;
    EXPECT_FLOAT_EQ(d.x.data<float>()[1], 1.5f) << header;
    EXPECT_EQ(d.y.data<int64_t>()[1], 1) << header;
  }
  // Blank lines before the header do not make it data.
  Dataset d = load_csv(write("blank.csv", "\n\nx,1,label\n2,3,0\n"));
  EXPECT_EQ(d.size(), 1);
  // An all-numeric first line is a sample, and a later line that is not numeric is an error,
  // not a second header.
  const std::string late = write("late.csv", "1,2,0\na,b,label\n");
  EXPECT_NE(error_of([&] { load_csv(late); }).find("late.csv:2: column 1: 'a' is not a number"),
            std::string::npos);
  const std::string two_headers = write("two.csv", "x,y,label\n,0,label\n1,2,0\n");
  EXPECT_NE(error_of([&] { load_csv(two_headers); }).find("two.csv:2: column 1"),
            std::string::npos);
}

TEST_F(DataFiles, BadCsvFilesNameTheFileAndLine) {
  const std::string ragged = write("ragged.csv", "1,2,0\n3,1\n");
  EXPECT_NE(error_of([&] { load_csv(ragged); }).find("ragged.csv:2: expected 3 columns, got 2"),
            std::string::npos);
  const std::string word = write("word.csv", "1,2,0\n3,abc,1\n");
  EXPECT_NE(error_of([&] { load_csv(word); }).find("word.csv:2: column 2: 'abc' is not a number"),
            std::string::npos);
  const std::string empty = write("empty.csv", "");
  EXPECT_NE(error_of([&] { load_csv(empty); }).find("no samples"), std::string::npos);
  const std::string only_header = write("header.csv", "x,y\n");
  EXPECT_NE(error_of([&] { load_csv(only_header); }).find("no samples"), std::string::npos);
  const std::string label = write("label.csv", "1,2,0\n1,2,-1\n");
  EXPECT_NE(error_of([&] { load_csv(label); }).find("label.csv:2: the label -1 is not an integer"),
            std::string::npos);
  const std::string fraction = write("fraction.csv", "1,2,0.5\n");
  EXPECT_NE(error_of([&] { load_csv(fraction); }).find("the label 0.5"), std::string::npos);
  EXPECT_NE(error_of([&] { load_csv((dir_ / "missing.csv").string()); }).find("cannot open"),
            std::string::npos);
}

std::string be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

TEST_F(DataFiles, MnistIdxFilesAndTheirErrors) {
  std::string pixels(2 * 2 * 3, '\0');
  pixels[0] = static_cast<char>(255);
  pixels[11] = static_cast<char>(51);
  write("train-images-idx3-ubyte", be32(2051) + be32(2) + be32(2) + be32(3) + pixels);
  write("train-labels-idx1-ubyte", be32(2049) + be32(2) + std::string{7, 3});
  Dataset d = load_mnist(dir_.string(), true);
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(d.features(), 6);
  EXPECT_EQ(d.classes, 10);
  EXPECT_FLOAT_EQ(d.x.data<float>()[0], 1.0f);
  EXPECT_FLOAT_EQ(d.x.data<float>()[11], 0.2f);
  EXPECT_EQ(d.y.data<int64_t>()[0], 7);
  write("t10k-images-idx3-ubyte", be32(2049) + be32(1) + be32(2) + be32(3) + pixels);
  write("t10k-labels-idx1-ubyte", be32(2049) + be32(1) + std::string{1});
  EXPECT_NE(error_of([&] { load_mnist(dir_.string(), false); }).find("expected 2051"),
            std::string::npos);
  write("t10k-images-idx3-ubyte", be32(2051) + be32(2) + be32(2) + be32(3) + pixels.substr(0, 7));
  write("t10k-labels-idx1-ubyte", be32(2049) + be32(2) + std::string{1, 2});
  EXPECT_NE(error_of([&] { load_mnist(dir_.string(), false); }).find("ends before its 2 images"),
            std::string::npos);
  write("t10k-images-idx3-ubyte", be32(2051) + be32(2) + be32(2) + be32(3) + pixels);
  write("t10k-labels-idx1-ubyte", be32(2049) + be32(3) + std::string{1, 2, 3});
  EXPECT_NE(error_of([&] { load_mnist(dir_.string(), false); }).find("2 images but"),
            std::string::npos);
}

}  // namespace
}  // namespace gradwire::examples
