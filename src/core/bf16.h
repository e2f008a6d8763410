/* bf16 <-> fp32 conversion on the host. bf16 is the upper half of an IEEE
 * binary32; rounding to it is round-to-nearest-even, NaNs stay NaN (quiet). */
#ifndef MT_BF16_H
#define MT_BF16_H

#include <stdint.h>
#include <string.h>

static inline float mt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t mt_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
