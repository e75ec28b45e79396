// Copies that involve a CUDA device (host<->device, device<->device, any dtype pair,
// strided and expanded sources) and fill.
//
// Strategy: the bytes cross between memories only as one packed block in the destination's
// dtype, through cudaMemcpy / cudaMemcpyPeer. Whatever packing or conversion is needed
// happens on the side that has the data: on the host with the CPU copy before an upload,
// on the device with convert_kernel before a download, and again on the device when the
// destination is strided and the block lands in a staging buffer first.
//
// Synchronisation (see cuda_utils.h): uploads and downloads are synchronous cudaMemcpy
// calls, which also wait for earlier kernels on the legacy default stream, so a download
// returns the results of every op issued before it. Copies between devices wait for the
// transfer to finish. Copies within one device are ordered on the default stream.
#include <cuda_runtime.h>

#include "cuda/cuda_utils.h"
#include "gradwire/tensor/factory.h"
#include "kernels.h"

namespace gradwire::detail::cuda {

namespace {

template <typename D, typename S>
__global__ void convert_kernel(D* dst, StridedIndexer dst_index, const S* src,
                               StridedIndexer src_index, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[dst_index.offset(i)] = convert<D>(src[src_index.offset(i)]);
  }
}

template <typename T>
__global__ void fill_kernel(T* dst, StridedIndexer index, T value, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[index.offset(i)] = value;
  }
}

bool packed_same_dtype(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.is_contiguous() && b.is_contiguous();
}

// dst and src on one device, same shape; src may be expanded.
void copy_within_device(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(device_of(dst));
  if (packed_same_dtype(dst, src)) {
    GRADWIRE_CUDA_CHECK(
        cudaMemcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice));
    return;
  }
  const auto index = make_indexers<2>("copy_", dst.sizes(), {dst.strides(), src.strides()});
  dispatch_all(dst.dtype(), "copy_", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_all(src.dtype(), "copy_", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      convert_kernel<D, S><<<blocks_for(n), kBlockSize>>>(static_cast<D*>(dst.data_ptr()), index[0],
                                                          static_cast<const S*>(src.data_ptr()),
                                                          index[1], n);
      GRADWIRE_CUDA_CHECK_LAUNCH("convert_kernel");
    });
  });
}

// src (on a device) as one packed block of `dtype` on the same device.
Tensor packed_on_device(const Tensor& src, DType dtype) {
  if (src.dtype() == dtype && src.is_contiguous()) return src;
  Tensor packed = empty(src.sizes(), TensorOptions(dtype).device(src.device()));
  copy_within_device(packed, src);
  return packed;
}

// Where a packed block for dst can land: dst itself when it is packed, else a staging
// buffer on dst's device that the caller then scatters into dst.
Tensor landing_for(const Tensor& dst) {
  return dst.is_contiguous() ? dst : empty(dst.sizes(), dst.options());
}

void upload(const Tensor& dst, const Tensor& src) {
  // Packing and conversion on the host are the CPU copy's job; it also materialises an
  // expanded source.
  const Tensor host = src.to(dst.dtype()).contiguous();
  const Tensor landing = landing_for(dst);
  {
    DeviceGuard guard(device_of(dst));
    GRADWIRE_CUDA_CHECK(
        cudaMemcpy(landing.data_ptr(), host.data_ptr(), landing.nbytes(), cudaMemcpyHostToDevice));
  }
  if (!landing.is_same(dst)) copy_within_device(dst, landing);
}

void download(const Tensor& dst, const Tensor& src) {
  const Tensor packed = packed_on_device(src, dst.dtype());
  const Tensor landing = landing_for(dst);
  {
    DeviceGuard guard(device_of(src));
    GRADWIRE_CUDA_CHECK(cudaMemcpy(landing.data_ptr(), packed.data_ptr(), landing.nbytes(),
                                   cudaMemcpyDeviceToHost));
  }
  if (!landing.is_same(dst)) {
    Tensor target = dst;
    target.copy_(landing);
  }
}

void copy_between_devices(const Tensor& dst, const Tensor& src) {
  const Tensor packed = packed_on_device(src, dst.dtype());
  const Tensor landing = landing_for(dst);
  {
    DeviceGuard guard(device_of(dst));
    GRADWIRE_CUDA_CHECK(cudaMemcpyPeer(landing.data_ptr(), device_of(dst), packed.data_ptr(),
                                       device_of(src), landing.nbytes()));
    // cudaMemcpyPeer may return before the transfer ends; `packed` must outlive it.
    GRADWIRE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  if (!landing.is_same(dst)) copy_within_device(dst, landing);
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  GRADWIRE_CHECK(dst.sizes() == src.sizes())
      << "cuda copy: shapes " << dst.shape_string() << " and " << src.shape_string();
  if (dst.numel() == 0) return;
  if (dst.is_cuda() && src.is_cuda()) {
    if (dst.device() == src.device()) {
      copy_within_device(dst, src);
    } else {
      copy_between_devices(dst, src);
    }
  } else if (dst.is_cuda()) {
    upload(dst, src);
  } else {
    download(dst, src);
  }
}

void fill(const Tensor& dst, Scalar value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(device_of(dst));
  const auto index = make_indexers<1>("fill_", dst.sizes(), {dst.strides()});
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_kernel<T><<<blocks_for(n), kBlockSize>>>(static_cast<T*>(dst.data_ptr()), index[0],
                                                  value.to<T>(), n);
    GRADWIRE_CUDA_CHECK_LAUNCH("fill_kernel");
  });
}

}  // namespace gradwire::detail::cuda
