// The examples' click-through task: the parameter server's canonical workload, an
// embedding table far larger than what a batch touches.
//
// A sample is `fields` categorical ids (one per field: user, item, ...), each a row of a
// table of `rows` rows; its label (clicked or not) depends on those rows: every row r has
// a hidden preference s(r) in {-1, +1}, and a sample is clicked when the preferences of its
// ids sum to more than zero (`fields` is odd, so never a tie). A model learns it only by
// learning each row's embedding, so held-out accuracy shows that the table itself learns.
// As in real traffic, ids are not uniform over the table: they come from `hot` rows spread
// over all of it (row = a hash of a hot id), so a table of 10^7 rows is trained by batches
// that touch a few hundred rows each, and held-out samples are new combinations of rows
// that training saw. Everything is derived from a seed by hashing: the same data on every
// process, no table-sized memory to make it.
//
// Thread-safety: plain functions.
#pragma once

#include <gradwire/gradwire.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace gradwire::examples {

struct ClickTask {
  int64_t rows = 100000;  // the table's rows (ids are in [0, rows))
  int64_t hot = 1000;     // distinct rows the traffic uses
  int64_t fields = 3;     // ids per sample (odd)
  uint64_t seed = 7;
};

// A 64-bit mix (splitmix64's finaliser): every bit of `x` reaches every bit of the result.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The row of hot id h (spread over the whole table), and a row's hidden preference (a
// property of the row, so two hot ids that land on one row agree).
inline int64_t click_row(const ClickTask& task, int64_t h) {
  return static_cast<int64_t>(mix64(task.seed * 1315423911ULL + static_cast<uint64_t>(h)) %
                              static_cast<uint64_t>(task.rows));
}
inline int click_preference(const ClickTask& task, int64_t row) {
  return (mix64(task.seed ^ (static_cast<uint64_t>(row) * 0x2545f4914f6cdd1dULL)) & 1) ? 1 : -1;
}

// `n` samples (the `part`-th draw of the task: 0 for training, 1 for held-out):
// ids int64 [n, fields], labels int64 [n] (1: clicked).
inline std::pair<Tensor, Tensor> clicks(const ClickTask& task, int64_t n, uint64_t part) {
  std::vector<int64_t> ids, labels;
  ids.reserve(static_cast<size_t>(n * task.fields));
  labels.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int score = 0;
    for (int64_t f = 0; f < task.fields; ++f) {
      const uint64_t draw = mix64((task.seed + 1000003ULL * (part + 1)) ^
                                  (static_cast<uint64_t>(i * task.fields + f) << 1));
      const int64_t h = static_cast<int64_t>(draw % static_cast<uint64_t>(task.hot));
      const int64_t row = click_row(task, h);
      ids.push_back(row);
      score += click_preference(task, row);
    }
    labels.push_back(score > 0 ? 1 : 0);
  }
  return {tensor<int64_t>(ids, {n, task.fields}), tensor<int64_t>(labels)};
}

}  // namespace gradwire::examples
