// Where a tensor's memory lives: the host ("cpu") or a CUDA device ("cuda:N").
//
// Thread-safety: Device is a plain value. cuda_device_count() may be called from any
// thread; it is 0 in a build without CUDA or on a machine without a GPU.
//
// Example:
//   Device d = parse_device("cuda:1");   // Device{DeviceType::kCUDA, 1}
//   if (cuda_is_available()) x = x.to(Device::cuda(0));
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace gradwire {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int16_t index = 0;  // CUDA ordinal; always 0 for the CPU

  static constexpr Device cpu() { return Device{DeviceType::kCPU, 0}; }
  static constexpr Device cuda(int index = 0) {
    return Device{DeviceType::kCUDA, static_cast<int16_t>(index)};
  }
  constexpr bool is_cpu() const { return type == DeviceType::kCPU; }
  constexpr bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
  std::string str() const;  // "cpu" or "cuda:N"
};

std::ostream& operator<<(std::ostream& os, const Device& d);
// Parses "cpu", "cuda" (device 0) or "cuda:N"; throws InvalidArgument otherwise.
Device parse_device(std::string_view text);

// Number of usable CUDA devices (0 without CUDA support or hardware).
int cuda_device_count();
inline bool cuda_is_available() { return cuda_device_count() > 0; }

}  // namespace gradwire
