#include "gradwire/nn/serialize.h"

#include <zlib.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/wire.h"

namespace gradwire::nn {
namespace {

constexpr char kMagic[8] = {'G', 'W', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr uint32_t kMaxName = 65536;

uint32_t checksum(const char* data, size_t n) {
  // crc32_z takes a size_t length: no 4 GiB limit per call.
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(data), n));
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
  const char* here() const { return bytes_.data() + pos_; }
  void skip(size_t n) { pos_ += n; }
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
    put<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out.append(name);
    const Tensor c = t.detach().to(Device::cpu()).contiguous();
    // Described as what is written: canonical contiguous strides (a contiguous tensor may
    // carry any stride on a size-1 dim), offset 0, cpu.
    TensorMeta meta;
    meta.dtype = c.dtype();
    meta.sizes = c.sizes();
    meta.strides = contiguous_strides(c.sizes());
    try {
      encode_tensor_meta(meta, out);
    } catch (const InvalidArgument& e) {
      GRADWIRE_THROW(InvalidArgument) << "nn::save: '" << name << "': " << e.what();
    }
    const size_t start = out.size();
    out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
    if constexpr (std::endian::native == std::endian::big) {
      swap_elements(out.data() + start, c.nbytes(), static_cast<size_t>(c.element_size()));
    }
  }
  put<uint32_t>(out, checksum(out.data(), out.size()));
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
  const bool crc_ok = checksum(bytes.data(), bytes.size() - 4) == stored_crc;
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
    const std::string what = entry + " '" + name + "'";
    // The metadata decoder bounds the tensor by the bytes left, so no claimed size can
    // overflow or over-allocate; its message names the field.
    const uint64_t left = r.remaining();
    size_t used = 0;
    TensorMeta meta;
    try {
      meta = decode_tensor_meta(r.here(), r.remaining(), &used, static_cast<int64_t>(left));
    } catch (const InvalidArgument& e) {
      r.fail(what + ": " + e.what());
    }
    r.skip(used);
    if (!meta.device.is_cpu()) {
      r.fail(what + ": stored on " + meta.device.str() + "; a state file holds cpu tensors");
    }
    if (meta.storage_offset != 0 || meta.strides != contiguous_strides(meta.sizes)) {
      r.fail(what + ": strides " + shape_to_string(meta.strides) + " with offset " +
             std::to_string(meta.storage_offset) + " for shape " + shape_to_string(meta.sizes) +
             "; a state file holds contiguous tensors");
    }
    const uint64_t numel = static_cast<uint64_t>(meta.numel());
    const uint64_t width = static_cast<uint64_t>(element_size(meta.dtype));
    if (numel > r.remaining() / width) {
      r.fail("file is truncated: " + what + " of shape " + shape_to_string(meta.sizes) + " needs " +
             std::to_string(numel * width) + " bytes, only " + std::to_string(r.remaining()) +
             " remain");
    }
    std::string_view data = r.take(static_cast<size_t>(numel * width), "data");
    Tensor t = empty(meta.sizes, TensorOptions(meta.dtype));
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
