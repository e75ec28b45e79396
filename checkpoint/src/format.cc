#include "format.h"

#include <zlib.h>

#include <charconv>
#include <cstdio>
#include <set>
#include <sstream>

#include "gradwire/core/check.h"

namespace gradwire::checkpoint::detail {
namespace {

constexpr std::string_view kHeader = "gradwire-checkpoint";
constexpr std::string_view kChecksumField = "checksum";
constexpr std::string_view kNone = "-";

// Names are written with every byte outside '!'..'~', and '%', as %XX, so that a field
// never holds a space or a line break; a name that is exactly "-" is written "%2D" so it
// cannot be read as "none".
std::string encode_name(std::string_view name) {
  if (name == kNone) return "%2D";
  std::string out;
  for (unsigned char c : name) {
    if (c > ' ' && c <= '~' && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// Reads one manifest line's fields, failing with the file and line number.
class Line {
 public:
  Line(std::string_view text, const std::string& path, size_t number)
      : path_(path), number_(number) {
    size_t start = 0;
    while (start <= text.size()) {
      const size_t end = std::min(text.find(' ', start), text.size());
      fields_.push_back(text.substr(start, end - start));
      start = end + 1;
    }
  }
  std::string_view key() const { return fields_.front(); }
  void expect_fields(size_t n) const {
    if (fields_.size() != n) {
      fail("'" + std::string(key()) + "' takes " + std::to_string(n - 1) + " value(s), found " +
           std::to_string(fields_.size() - 1));
    }
  }
  std::string_view field(size_t i) const { return fields_.at(i); }
  std::string name(size_t i) const;
  int64_t integer(size_t i, int64_t min, int64_t max) const;
  uint32_t checksum(size_t i) const;
  std::vector<int64_t> sizes(size_t i) const;
  [[noreturn]] void fail(const std::string& problem) const {
    GRADWIRE_THROW(InvalidArgument)
        << "checkpoint: " << path_ << ": line " << number_ << ": " << problem;
  }

 private:
  const std::string& path_;
  size_t number_;
  std::vector<std::string_view> fields_;
};

std::string Line::name(size_t i) const {
  const std::string_view text = field(i);
  std::string out;
  for (size_t k = 0; k < text.size(); ++k) {
    if (text[k] != '%') {
      out.push_back(text[k]);
      continue;
    }
    const int hi = k + 2 < text.size() ? hex_digit(text[k + 1]) : -1;
    const int lo = hi >= 0 ? hex_digit(text[k + 2]) : -1;
    if (lo < 0) fail("bad escape in name '" + std::string(text) + "'");
    out.push_back(static_cast<char>(hi * 16 + lo));
    k += 2;
  }
  if (out.empty() || out.size() > kMaxNameBytes) {
    fail("a name must have 1 to " + std::to_string(kMaxNameBytes) + " bytes, found " +
         std::to_string(out.size()));
  }
  return out;
}

int64_t Line::integer(size_t i, int64_t min, int64_t max) const {
  const std::string_view text = field(i);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min || v > max) {
    fail("'" + std::string(text) + "' is not an integer in [" + std::to_string(min) + ", " +
         std::to_string(max) + "]");
  }
  return v;
}

uint32_t Line::checksum(size_t i) const {
  const std::string_view text = field(i);
  uint32_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
  if (text.size() != 8 || ec != std::errc() || end != text.data() + text.size())
    fail("'" + std::string(text) + "' is not an 8-digit hexadecimal crc32");
  return v;
}

std::vector<int64_t> Line::sizes(size_t i) const {
  const std::string_view text = field(i);
  const std::string bad = "'" + std::string(text) + "' is not a list of sizes like [5,4]";
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') fail(bad);
  std::vector<int64_t> out;
  const std::string_view inner = text.substr(1, text.size() - 2);
  if (inner.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(inner.find(',', start), inner.size());
    const std::string_view item = inner.substr(start, comma - start);
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0) fail(bad);
    out.push_back(v);
    if (out.size() > kMaxDims) fail("more than " + std::to_string(kMaxDims) + " dimensions");
    if (comma == inner.size()) return out;
    start = comma + 1;
  }
}

PieceEntry parse_piece(const Line& line) {
  line.expect_fields(6);
  PieceEntry p;
  p.name = line.name(1);
  try {
    p.dtype = parse_dtype(line.field(2));
  } catch (const InvalidArgument&) {
    line.fail("unknown dtype '" + std::string(line.field(2)) + "'");
  }
  p.sizes = line.sizes(3);
  if (line.field(4) != kNone) p.global_sizes = line.sizes(4);
  p.row_offset = line.integer(5, 0, INT64_MAX);
  return p;
}

void piece_line(std::ostringstream& os, std::string_view part, const PieceEntry& p) {
  os << part << ' ' << encode_name(p.name) << ' ' << dtype_name(p.dtype) << ' '
     << sizes_text(p.sizes) << ' '
     << (p.global_sizes.empty() ? std::string(kNone) : sizes_text(p.global_sizes)) << ' '
     << p.row_offset << '\n';
}

// Checks the last line is "checksum <crc32 of every byte before it>"; returns the rest.
std::string_view checked_body(std::string_view text, const std::string& path) {
  const auto fail = [&](const std::string& problem) {
    GRADWIRE_THROW(InvalidArgument) << "checkpoint: " << path << ": " << problem;
  };
  if (text.empty()) fail("the manifest is empty (truncated)");
  if (text.back() != '\n') fail("truncated: the manifest does not end with its checksum line");
  const size_t start = text.rfind('\n', text.size() - 2);
  const size_t line_start = start == std::string_view::npos ? 0 : start + 1;
  const std::string_view last = text.substr(line_start, text.size() - 1 - line_start);
  const std::string prefix = std::string(kChecksumField) + " ";
  if (last.substr(0, prefix.size()) != prefix)
    fail("truncated: the manifest does not end with its checksum line");
  const std::string_view body = text.substr(0, line_start);
  const std::string expected = hex32(crc32_of(body));
  if (last.substr(prefix.size()) != expected) {
    fail("checksum mismatch: the manifest's crc32 is " + expected + ", its checksum line says " +
         std::string(last.substr(prefix.size())) + " (the manifest is corrupt)");
  }
  return body;
}

// Applies one field line to the manifest; `seen` records the fields given once.
void apply_line(const Line& line, Manifest& m, std::set<std::string>& seen) {
  const std::string key(line.key());
  const bool once =
      key == "shard" || key == "seq" || key == "replicated" || key == "optimizer_kind";
  if (once && !seen.insert(key).second) line.fail("'" + key + "' given twice");
  if (key == "shard") {
    line.expect_fields(2);
    m.shard = line.name(1);
  } else if (key == "seq") {
    line.expect_fields(2);
    m.seq = line.integer(1, 0, kMaxSeq);
  } else if (key == "replicated") {
    line.expect_fields(2);
    m.replicated = line.integer(1, 0, 1) == 1;
  } else if (key == "optimizer_kind") {
    line.expect_fields(2);
    if (line.field(1) != kNone) m.optimizer_kind = line.name(1);
  } else if (key == "job_shard") {
    line.expect_fields(2);
    m.job_shards.push_back(line.name(1));
  } else if (key == "counter") {
    line.expect_fields(3);
    if (!m.counters.emplace(line.name(1), line.integer(2, INT64_MIN, INT64_MAX)).second)
      line.fail("counter '" + line.name(1) + "' given twice");
  } else if (key == "file") {
    line.expect_fields(4);
    m.files.push_back(
        {line.name(1), static_cast<uint64_t>(line.integer(2, 0, INT64_MAX)), line.checksum(3)});
  } else if (key == "param") {
    m.params.push_back(parse_piece(line));
  } else if (key == "optimizer") {
    m.optimizer.push_back(parse_piece(line));
  } else {
    line.fail("unknown field '" + key + "'");
  }
}

}  // namespace

std::string format_manifest(const Manifest& m) {
  std::ostringstream os;
  os << kHeader << ' ' << kFormatVersion << '\n';
  os << "shard " << encode_name(m.shard) << '\n';
  os << "seq " << m.seq << '\n';
  os << "replicated " << (m.replicated ? 1 : 0) << '\n';
  os << "optimizer_kind "
     << (m.optimizer_kind.empty() ? std::string(kNone) : encode_name(m.optimizer_kind)) << '\n';
  for (const std::string& s : m.job_shards)
    os << "job_shard " << encode_name(s) << '\n';
  for (const auto& [name, value] : m.counters)
    os << "counter " << encode_name(name) << ' ' << value << '\n';
  for (const FileEntry& f : m.files)
    os << "file " << encode_name(f.name) << ' ' << f.size << ' ' << hex32(f.crc) << '\n';
  for (const PieceEntry& p : m.params)
    piece_line(os, "param", p);
  for (const PieceEntry& p : m.optimizer)
    piece_line(os, "optimizer", p);
  std::string body = os.str();
  body += std::string(kChecksumField) + " " + hex32(crc32_of(body)) + "\n";
  return body;
}

Manifest parse_manifest(std::string_view text, const std::string& path) {
  const std::string_view body = checked_body(text, path);
  Manifest m;
  std::set<std::string> seen;
  size_t number = 0;
  size_t start = 0;
  while (start < body.size()) {
    const size_t end = body.find('\n', start);
    const std::string_view raw = body.substr(start, end - start);
    start = end + 1;
    const Line line(raw, path, ++number);
    if (number == 1) {
      const std::string expected = std::string(kHeader) + " " + std::to_string(kFormatVersion);
      if (raw.substr(0, kHeader.size() + 1) != std::string(kHeader) + " ")
        line.fail("not a gradwire checkpoint manifest (no '" + std::string(kHeader) + "' line)");
      if (raw != expected) {
        line.fail("unsupported format version '" + std::string(raw.substr(kHeader.size() + 1)) +
                  "' (this build reads " + std::to_string(kFormatVersion) + ")");
      }
      continue;
    }
    apply_line(line, m, seen);
  }
  if (number == 0) {
    GRADWIRE_THROW(InvalidArgument) << "checkpoint: " << path << ": no '" << kHeader << "' line";
  }
  for (const char* key : {"shard", "seq", "replicated", "optimizer_kind"}) {
    GRADWIRE_CHECK_ARG(seen.count(key) == 1)
        << "checkpoint: " << path << ": the manifest has no '" << key << "' line";
  }
  return m;
}

PieceEntry describe_piece(const Piece& piece) {
  return PieceEntry{piece.name, piece.value.dtype(), piece.value.sizes(), piece.global_sizes,
                    piece.row_offset};
}

uint32_t crc32_of(std::string_view bytes) {
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

uint32_t data_file_crc(std::string_view bytes) {
  return crc32_of(bytes.substr(0, bytes.size() >= 4 ? bytes.size() - 4 : 0));
}

std::string snapshot_name(int64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%012lld", static_cast<long long>(seq));
  return buf;
}

int64_t parse_snapshot_name(std::string_view name) {
  if (name.size() != 12) return -1;
  int64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool valid_shard_name(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) return false;
  }
  // "." and ".." would name the checkpoint directory itself or its parent.
  return name != "." && name != "..";
}

void check_shard_name(std::string_view name, std::string_view op) {
  GRADWIRE_CHECK_ARG(valid_shard_name(name))
      << op << ": shard name '" << name
      << "' is not 1 to 128 characters of [A-Za-z0-9_.:-] (nor '.' or '..')";
}

void check_seq(int64_t seq, std::string_view op) {
  GRADWIRE_CHECK_ARG(seq >= 0 && seq <= kMaxSeq)
      << op << ": seq " << seq << " is outside [0, " << kMaxSeq << "]";
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    out += (i ? "," : "") + std::to_string(sizes[i]);
  return out + "]";
}

std::string rows_text(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + "," + std::to_string(end) + ")";
}

}  // namespace gradwire::checkpoint::detail
