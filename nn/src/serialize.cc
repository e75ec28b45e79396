#include "gradwire/nn/serialize.h"

#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::nn {
namespace {

constexpr char kMagic[8] = {'G', 'W', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr uint32_t kMaxName = 65536;
constexpr uint32_t kMaxDims = 64;

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t crc32(const char* data, size_t n) {
  const auto& t = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i)
    c = t[(c ^ static_cast<uint8_t>(data[i])) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// Reverses each `width`-byte element in place (big-endian hosts only; on little-endian
// hosts every call is discarded at compile time).
[[maybe_unused]] void swap_elements(char* data, size_t bytes, size_t width) {
  if (width <= 1) return;
  for (size_t i = 0; i + width <= bytes; i += width) {
    for (size_t a = i, b = i + width - 1; a < b; ++a, --b)
      std::swap(data[a], data[b]);
  }
}

template <typename T>
void put(std::string& out, T value) {
  char buf[sizeof(T)];
  std::memcpy(buf, &value, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) swap_elements(buf, sizeof(T), sizeof(T));
  out.append(buf, sizeof(T));
}

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    char buf[sizeof(T)];
    std::memcpy(buf, bytes_.data() + pos_, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) {
      swap_elements(buf, sizeof(T), sizeof(T));
    }
    pos_ += sizeof(T);
    T value;
    std::memcpy(&value, buf, sizeof(T));
    return value;
  }
  std::string_view take(size_t n, const char* what) {
    need(n, what);
    std::string_view v = bytes_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  size_t remaining() const { return bytes_.size() - pos_; }
  [[noreturn]] void fail(const std::string& problem) const {
    GRADWIRE_THROW(InvalidArgument) << "nn::load: " << source_ << ": " << problem;
  }

 private:
  void need(size_t n, const char* what) const {
    if (n > remaining()) {
      std::ostringstream os;
      os << "file is truncated: " << what << " needs " << n << " bytes at offset " << pos_
         << ", only " << remaining() << " remain";
      fail(os.str());
    }
  }
  std::string_view bytes_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

std::string serialize(const StateDict& state) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, kStateFormatVersion);
  put<uint64_t>(out, state.size());
  for (const auto& [name, t] : state) {
    GRADWIRE_CHECK_ARG(name.size() <= kMaxName)
        << "nn::save: name of " << name.size() << " bytes exceeds " << kMaxName;
    GRADWIRE_CHECK_ARG(t.defined()) << "nn::save: '" << name << "' is an undefined tensor";
    GRADWIRE_CHECK_ARG(t.dim() <= int64_t{kMaxDims})
        << "nn::save: '" << name << "' has " << t.dim() << " dims, at most " << kMaxDims;
    put<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out.append(name);
    put<uint8_t>(out, static_cast<uint8_t>(t.dtype()));
    put<uint32_t>(out, static_cast<uint32_t>(t.dim()));
    for (int64_t s : t.sizes())
      put<int64_t>(out, s);
    const Tensor c = t.detach().to(Device::cpu()).contiguous();
    const size_t start = out.size();
    out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
    if constexpr (std::endian::native == std::endian::big) {
      swap_elements(out.data() + start, c.nbytes(), static_cast<size_t>(c.element_size()));
    }
  }
  put<uint32_t>(out, crc32(out.data(), out.size()));
  return out;
}

StateDict deserialize(std::string_view bytes, const std::string& source) {
  Reader header(bytes, source);
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    header.fail("not a gradwire state file (bad magic)");
  }
  if (bytes.size() < sizeof(kMagic) + 4 + 8 + 4) header.fail("file is truncated: no header");
  Reader r(bytes.substr(0, bytes.size() - 4), source);
  r.take(sizeof(kMagic), "magic");
  const auto version = r.get<uint32_t>("version");
  if (version != kStateFormatVersion) {
    r.fail("unsupported format version " + std::to_string(version) + " (this build reads " +
           std::to_string(kStateFormatVersion) + ")");
  }
  uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  if constexpr (std::endian::native == std::endian::big) {
    swap_elements(reinterpret_cast<char*>(&stored_crc), 4, 4);
  }
  const bool crc_ok = crc32(bytes.data(), bytes.size() - 4) == stored_crc;
  const auto count = r.get<uint64_t>("entry count");
  StateDict out;
  // Parsing goes first so that a truncated file is reported as such; the checksum then
  // catches damage that still parses.
  for (uint64_t i = 0; i < count; ++i) {
    const std::string entry = "entry " + std::to_string(i);
    const auto name_len = r.get<uint32_t>("name length");
    if (name_len > kMaxName) {
      r.fail(entry + ": name length " + std::to_string(name_len) + " exceeds " +
             std::to_string(kMaxName));
    }
    std::string name(r.take(name_len, "name"));
    const auto code = r.get<uint8_t>("dtype");
    if (code >= kNumDTypes) {
      r.fail(entry + " '" + name + "': bad dtype code " + std::to_string(code));
    }
    const auto dtype = static_cast<DType>(code);
    const auto ndim = r.get<uint32_t>("rank");
    if (ndim > kMaxDims) {
      r.fail(entry + " '" + name + "': rank " + std::to_string(ndim) + " exceeds " +
             std::to_string(kMaxDims));
    }
    Shape sizes(ndim);
    // Bound the element count by the bytes left, so no size can overflow or over-allocate.
    const uint64_t budget = r.remaining();
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      sizes[d] = r.get<int64_t>("size");
      if (sizes[d] < 0) {
        r.fail(entry + " '" + name + "': negative size " + std::to_string(sizes[d]));
      }
      const auto s = static_cast<uint64_t>(sizes[d]);
      if (s != 0 && numel > budget / s) {
        r.fail(entry + " '" + name + "': shape " + shape_to_string(sizes) +
               " needs more bytes than the file holds");
      }
      numel *= s;
    }
    const uint64_t width = static_cast<uint64_t>(element_size(dtype));
    if (numel > r.remaining() / width) {
      r.fail("file is truncated: " + entry + " '" + name + "' of shape " + shape_to_string(sizes) +
             " needs " + std::to_string(numel * width) + " bytes, only " +
             std::to_string(r.remaining()) + " remain");
    }
    std::string_view data = r.take(static_cast<size_t>(numel * width), "data");
    Tensor t = empty(sizes, TensorOptions(dtype));
    std::memcpy(t.data_ptr(), data.data(), data.size());
    if constexpr (std::endian::native == std::endian::big) {
      swap_elements(static_cast<char*>(t.data_ptr()), data.size(), static_cast<size_t>(width));
    }
    out.emplace_back(std::move(name), std::move(t));
  }
  if (r.remaining() != 0) {
    r.fail(std::to_string(r.remaining()) + " unexpected bytes after the last of " +
           std::to_string(count) + " entries");
  }
  if (!crc_ok) r.fail("checksum mismatch: the file is corrupt");
  return out;
}

void save(const StateDict& state, const std::string& path) {
  const std::string image = serialize(state);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f.good()) GRADWIRE_THROW(Error) << "nn::save: cannot open '" << tmp << "' for writing";
    f.write(image.data(), static_cast<std::streamsize>(image.size()));
    f.flush();
    if (!f.good()) {
      std::remove(tmp.c_str());
      GRADWIRE_THROW(Error) << "nn::save: writing '" << tmp << "' failed";
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    GRADWIRE_THROW(Error) << "nn::save: cannot rename '" << tmp << "' to '" << path << "'";
  }
}

StateDict load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  GRADWIRE_CHECK_ARG(f.good()) << "nn::load: cannot open '" << path << "'";
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  GRADWIRE_CHECK_ARG(!f.bad()) << "nn::load: reading '" << path << "' failed";
  return deserialize(bytes, path);
}

void save(const Module& module, const std::string& path) {
  save(module.state_dict(), path);
}

void load(Module& module, const std::string& path) {
  StateDict state = load(path);
  try {
    module.load_state_dict(state, /*strict=*/true);
  } catch (const InvalidArgument& e) {
    GRADWIRE_THROW(InvalidArgument) << "nn::load: " << path << ": " << e.what();
  }
}

}  // namespace gradwire::nn
