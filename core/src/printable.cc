#include "gradwire/core/printable.h"

namespace gradwire {
namespace {

std::string escaped(std::string_view text, size_t max_bytes, bool escape_backslash) {
  const size_t kept = text.size() < max_bytes ? text.size() : max_bytes;
  std::string out;
  out.reserve(kept + 16);
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < kept; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\' && escape_backslash) {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  if (kept < text.size()) out += "... (+" + std::to_string(text.size() - kept) + " bytes)";
  return out;
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  return escaped(text, max_bytes, /*escape_backslash=*/true);
}

std::string printable_relayed(std::string_view text, size_t max_bytes) {
  return escaped(text, max_bytes, /*escape_backslash=*/false);
}

}  // namespace gradwire
