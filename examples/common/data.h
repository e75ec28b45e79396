// Datasets for the examples: numeric CSV files and MNIST's IDX files, read with every
// mistake in the file reported as an InvalidArgument naming the file and the line (or the
// byte offset).
//
//   Dataset d = examples::load_csv("iris.csv");          // label in the last column
//   auto [train, test] = examples::split(d, 0.2, 7);      // 20% held out
//   Dataset m = examples::load_mnist("/data/mnist", true); // train-images-idx3-ubyte, ...
//
// CSV: comma-separated numbers, one sample per line, the label last: an integer in
// [0, kMaxClasses). A first line (blank lines aside) that is not all numbers is taken as a
// header, even when some of its fields are numbers (",0,1,label"). Blank lines
// are skipped. A ragged row, a field that is not a number, a file with no sample, or a label
// that is not such an integer is refused.
// MNIST: the IDX files as distributed (big-endian headers, magic 2051 for images and 2049
// for labels), pixels scaled to [0, 1] and flattened to 784 features; the counts of the two
// files must agree.
//
// Thread-safety: plain functions.
#pragma once

#include <gradwire/gradwire.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace gradwire::examples {

inline constexpr int64_t kMaxClasses = 10000;

struct Dataset {
  Tensor x;             // float32 [N, F]
  Tensor y;             // int64 [N]
  int64_t classes = 0;  // 1 + the largest label
  int64_t size() const { return x.defined() ? x.size(0) : 0; }
  int64_t features() const { return x.defined() ? x.size(1) : 0; }
};

namespace detail {

inline std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ','))
    out.push_back(field);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

inline std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

// The number in `text`, or false.
inline bool parse_number(const std::string& text, double& out) {
  const std::string t = trim(text);
  if (t.empty()) return false;
  errno = 0;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() && errno == 0 && std::isfinite(out);
}

inline uint32_t read_be32(std::ifstream& in, const std::string& path, const char* what) {
  unsigned char b[4];
  if (!in.read(reinterpret_cast<char*>(b), 4)) {
    throw InvalidArgument(path + ": the file ends inside its header (" + what + ")");
  }
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

}  // namespace detail

inline Dataset load_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(path + ": cannot open (" + std::strerror(errno) + ")");
  std::vector<float> xs;
  std::vector<int64_t> ys;
  size_t columns = 0;
  int64_t classes = 0;
  bool seen_first_line = false;  // the first line that is not blank
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (detail::trim(line).empty()) continue;
    const std::vector<std::string> fields = detail::split_fields(line);
    std::vector<double> values(fields.size());
    bool all_numbers = true;
    for (size_t c = 0; c < fields.size(); ++c)
      all_numbers = detail::parse_number(fields[c], values[c]) && all_numbers;
    // The first line is a header unless every field is a number: a pandas export's header
    // names its columns by index (",0,1,label" or "id,0,1,label").
    if (!seen_first_line) {
      seen_first_line = true;
      if (!all_numbers) continue;
    }
    const std::string where = path + ":" + std::to_string(number);
    if (fields.size() < 2) {
      throw InvalidArgument(where + ": a sample needs at least one feature and a label, got " +
                            std::to_string(fields.size()) + " column(s)");
    }
    if (columns == 0) columns = fields.size();
    if (fields.size() != columns) {
      throw InvalidArgument(where + ": expected " + std::to_string(columns) + " columns, got " +
                            std::to_string(fields.size()));
    }
    if (!all_numbers) {
      for (size_t c = 0; c < fields.size(); ++c) {
        double v = 0;
        if (!detail::parse_number(fields[c], v)) {
          throw InvalidArgument(where + ": column " + std::to_string(c + 1) + ": '" +
                                detail::trim(fields[c]) + "' is not a number");
        }
      }
    }
    const double label = values.back();
    if (label < 0 || label >= static_cast<double>(kMaxClasses) || std::floor(label) != label) {
      throw InvalidArgument(where + ": the label " + detail::trim(fields.back()) +
                            " is not an integer in [0, " + std::to_string(kMaxClasses) + ")");
    }
    for (size_t c = 0; c + 1 < values.size(); ++c)
      xs.push_back(static_cast<float>(values[c]));
    ys.push_back(static_cast<int64_t>(label));
    classes = std::max(classes, static_cast<int64_t>(label) + 1);
  }
  if (ys.empty()) throw InvalidArgument(path + ": no samples (the file is empty or only a header)");
  const auto n = static_cast<int64_t>(ys.size());
  return Dataset{tensor<float>(xs, {n, static_cast<int64_t>(columns - 1)}), tensor<int64_t>(ys),
                 classes};
}

// A shuffled split: `test_fraction` of the samples (at least one, if any) held out.
inline std::pair<Dataset, Dataset> split(const Dataset& d, double test_fraction, uint64_t seed) {
  if (!(test_fraction > 0 && test_fraction < 1)) {
    throw InvalidArgument("the test fraction must be in (0, 1), got " +
                          std::to_string(test_fraction));
  }
  if (d.size() < 2) throw InvalidArgument("a split needs at least two samples");
  Generator gen(seed);
  const Tensor order = randperm(d.size(), &gen);
  int64_t n_test = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(test_fraction * static_cast<double>(d.size()))));
  n_test = std::min(n_test, d.size() - 1);
  const Tensor test_rows = order.slice(0, 0, n_test), train_rows = order.slice(0, n_test, d.size());
  return {Dataset{index_select(d.x, 0, train_rows), index_select(d.y, 0, train_rows), d.classes},
          Dataset{index_select(d.x, 0, test_rows), index_select(d.y, 0, test_rows), d.classes}};
}

// MNIST from `dir`: the training set (train-*) or the test set (t10k-*).
inline Dataset load_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte";
  const std::string labels_path = prefix + "-labels-idx1-ubyte";
  std::ifstream images(images_path, std::ios::binary), labels(labels_path, std::ios::binary);
  if (!images) throw InvalidArgument(images_path + ": cannot open (" + std::strerror(errno) + ")");
  if (!labels) throw InvalidArgument(labels_path + ": cannot open (" + std::strerror(errno) + ")");
  if (const uint32_t m = detail::read_be32(images, images_path, "magic"); m != 2051) {
    throw InvalidArgument(images_path + ": magic " + std::to_string(m) +
                          ", expected 2051 (an IDX file of images)");
  }
  const uint32_t n = detail::read_be32(images, images_path, "count");
  const uint32_t rows = detail::read_be32(images, images_path, "rows");
  const uint32_t cols = detail::read_be32(images, images_path, "columns");
  if (const uint32_t m = detail::read_be32(labels, labels_path, "magic"); m != 2049) {
    throw InvalidArgument(labels_path + ": magic " + std::to_string(m) +
                          ", expected 2049 (an IDX file of labels)");
  }
  const uint32_t n_labels = detail::read_be32(labels, labels_path, "count");
  if (n != n_labels) {
    throw InvalidArgument(images_path + " holds " + std::to_string(n) + " images but " +
                          labels_path + " " + std::to_string(n_labels) + " labels");
  }
  if (n == 0 || rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || n > (1u << 24)) {
    throw InvalidArgument(images_path + ": implausible sizes " + std::to_string(n) + " x " +
                          std::to_string(rows) + " x " + std::to_string(cols));
  }
  const size_t pixels = size_t{rows} * cols;
  std::vector<unsigned char> raw(size_t{n} * pixels);
  if (!images.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()))) {
    throw InvalidArgument(images_path + ": the file ends before its " + std::to_string(n) +
                          " images (" + std::to_string(images.gcount()) + " of " +
                          std::to_string(raw.size()) + " pixel bytes)");
  }
  std::vector<unsigned char> raw_labels(n);
  if (!labels.read(reinterpret_cast<char*>(raw_labels.data()), n)) {
    throw InvalidArgument(labels_path + ": the file ends before its " + std::to_string(n) +
                          " labels");
  }
  std::vector<float> xs(raw.size());
  for (size_t i = 0; i < raw.size(); ++i)
    xs[i] = static_cast<float>(raw[i]) / 255.0f;
  std::vector<int64_t> ys(n);
  int64_t classes = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (raw_labels[i] > 9) {
      throw InvalidArgument(labels_path + ": label " + std::to_string(raw_labels[i]) + " at byte " +
                            std::to_string(8 + i) + " is not a digit");
    }
    ys[i] = raw_labels[i];
    classes = std::max<int64_t>(classes, ys[i] + 1);
  }
  return Dataset{tensor<float>(xs, {static_cast<int64_t>(n), static_cast<int64_t>(pixels)}),
                 tensor<int64_t>(ys), std::max<int64_t>(classes, 10)};
}

}  // namespace gradwire::examples
