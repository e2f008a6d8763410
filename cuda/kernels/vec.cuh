/* Element access shared by the CUDA kernels' translation units (kernels.cu, moe.cu): a vector of W
 * elements of bf16 or fp32 to W floats and back, through 16-byte accesses where W allows, and the
 * alignment test that picks those paths. Device code only; the definitions sit in an anonymous
 * namespace, so each file that includes this has its own inlined copy. */
#ifndef MT_CUDA_KERNELS_VEC_CUH
#define MT_CUDA_KERNELS_VEC_CUH

#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

typedef __nv_bfloat16 bf16;

namespace {

__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ uint32_t bf_pack(float a, float b) // a in the low half (the lower address)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

// v[0..W) = p[0..W) as floats; W is 1, 4 or a multiple of 8, and p is
// aligned to the access (16 bytes for W >= 4 fp32 or W >= 8 bf16).
template <int W, typename T> __device__ __forceinline__ void load(const T *p, float (&v)[W])
{
    if constexpr (std::is_same_v<T, float>) {
        if constexpr (W == 1) {
            v[0] = *p;
        } else {
            static_assert(W % 4 == 0, "fp32 vectors are float4s");
#pragma unroll
            for (int k = 0; k < W / 4; k++) {
                const float4 a = reinterpret_cast<const float4 *>(p)[k];
                v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
            }
        }
    } else {
        static_assert(std::is_same_v<T, bf16>, "bf16 or fp32");
        if constexpr (W == 1) {
            v[0] = __bfloat162float(*p);
        } else if constexpr (W == 4) {
            const uint2 a = *reinterpret_cast<const uint2 *>(p);
            v[0] = bf_lo(a.x), v[1] = bf_hi(a.x), v[2] = bf_lo(a.y), v[3] = bf_hi(a.y);
        } else {
            static_assert(W % 8 == 0, "bf16 vectors are 8 wide");
#pragma unroll
            for (int k = 0; k < W / 8; k++) {
                const uint4 a = reinterpret_cast<const uint4 *>(p)[k];
                v[8 * k] = bf_lo(a.x), v[8 * k + 1] = bf_hi(a.x), v[8 * k + 2] = bf_lo(a.y), v[8 * k + 3] = bf_hi(a.y);
                v[8 * k + 4] = bf_lo(a.z), v[8 * k + 5] = bf_hi(a.z), v[8 * k + 6] = bf_lo(a.w), v[8 * k + 7] = bf_hi(a.w);
            }
        }
    }
}

// p[0..W) = v[0..W), rounded to nearest even for bf16.
template <int W, typename T> __device__ __forceinline__ void store(T *p, const float (&v)[W])
{
    if constexpr (std::is_same_v<T, float>) {
        if constexpr (W == 1) {
            *p = v[0];
        } else {
#pragma unroll
            for (int k = 0; k < W / 4; k++)
                reinterpret_cast<float4 *>(p)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        }
    } else {
        if constexpr (W == 1) {
            *p = __float2bfloat16_rn(v[0]);
        } else if constexpr (W == 4) {
            *reinterpret_cast<uint2 *>(p) = make_uint2(bf_pack(v[0], v[1]), bf_pack(v[2], v[3]));
        } else {
#pragma unroll
            for (int k = 0; k < W / 8; k++)
                reinterpret_cast<uint4 *>(p)[k] = make_uint4(bf_pack(v[8 * k], v[8 * k + 1]), bf_pack(v[8 * k + 2], v[8 * k + 3]),
                                                            bf_pack(v[8 * k + 4], v[8 * k + 5]), bf_pack(v[8 * k + 6], v[8 * k + 7]));
        }
    }
}

bool al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} // namespace

#endif
