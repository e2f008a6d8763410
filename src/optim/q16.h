/* 16-bit block codes of the lean mode's weights (docs/lean-optimizer.md).
 *
 * A block of up to MT_Q16_BLOCK weights is stored as one int16 each and one
 * scale s, a power of two: the weight is q s, q in [-32767, 32767]. s is the
 * least power of two with the block's largest magnitude <= 32767 s (0 for a
 * block of zeros), so every weight of the block is held to within half of s
 * (rounding to nearest) or one s (stochastic rounding): at least 15 bits
 * below the block's largest weight, against bf16's 8 below each weight's own
 * leading bit. A power of two makes q s exact in fp32, and keeps the codes of
 * a block whose scale does not change exact through a decode and an encode.
 * The GPU computes with bf16(q s), rounded to nearest. */
#ifndef MT_OPTIM_Q16_H
#define MT_OPTIM_Q16_H

#include <stddef.h>
#include <stdint.h>

#define MT_Q16_BLOCK 256
#define MT_Q16_MAX 32767

/* The scale of a block whose largest magnitude is amax (finite, >= 0): the
 * least power of two s (at least 2^-126) with amax <= MT_Q16_MAX s; 0 when
 * amax is 0. */
float mt_q16_scale(float amax);

/* x[0..n) into codes q and *scale, rounded to nearest (ties to even). -1,
 * nothing written, if a value is NaN or infinite. */
int mt_q16_encode(const float *x, size_t n, int16_t *q, float *scale);

/* The same scale, the magnitudes x / s rounded up with probability equal to
 * their dropped fraction (truncated to 16 bits), from the 16 uniform random
 * bits r[i]: the expected code is x / s. -1 as mt_q16_encode. */
int mt_q16_encode_sr(const float *x, size_t n, const uint16_t *r, int16_t *q, float *scale);

/* x = q * scale (exact). */
void mt_q16_decode(const int16_t *q, size_t n, float scale, float *x);

/* bf16(q * scale), rounded to nearest even: what the GPU computes with. */
void mt_q16_to_bf16(const int16_t *q, size_t n, float scale, uint16_t *out);

/* The same over consecutive blocks: n codes, element i's scale
 * scale[i / MT_Q16_BLOCK]; _f32 gives those bf16 values widened to fp32. */
void mt_q16_blocks_to_bf16(const int16_t *q, const float *scale, size_t n, uint16_t *out);
void mt_q16_blocks_to_f32(const int16_t *q, const float *scale, size_t n, float *out);

#endif
