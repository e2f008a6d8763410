/* 8-bit codes for AdamW's moments, a block at a time (docs/lean-optimizer.md).
 *
 * A block of up to MT_Q8_BLOCK values is stored as one byte each and one fp32
 * scale: the value divided by the scale, as a small floating-point number
 * (the code's exponent and mantissa are bit fields, so encoding and decoding
 * are bit operations; rounding is to nearest, ties to even, or stochastic
 * with the _sr encoders):
 *
 *   signed (the first moment):   sign, 4-bit exponent, 3-bit mantissa of m / s,
 *                                |m / s| <= MT_Q8_MAX_SIGNED (1.875)
 *   sqrt (the second moment):    4-bit exponent, 4-bit mantissa of sqrt(v) / s,
 *                                sqrt(v) / s <= MT_Q8_MAX_SQRT (1.9375)
 *
 * Exponent e > 0 gives (1 + f / 2^mbits) 2^(e - 15); e = 0 gives f / 2^mbits
 * 2^-14 (subnormals, zero at f = 0). The scale is the block's largest
 * magnitude over the largest code's value, so the largest element is
 * represented exactly up to the scale's own rounding; a block of zeros has
 * scale 0. Relative error of a value in the normal range (at least 2^-14 of
 * the largest code's value times the scale): at most 2^-4 (signed) and
 * 2^-5 (sqrt, on sqrt(v)); below it, an absolute error of at most half the
 * smallest subnormal step times the scale. */
#ifndef MT_OPTIM_Q8_H
#define MT_OPTIM_Q8_H

#include <stddef.h>
#include <stdint.h>

#define MT_Q8_BLOCK 256
#define MT_Q8_MAX_SIGNED 1.875f
#define MT_Q8_MAX_SQRT 1.9375f

/* x[0..n) into codes q and *scale. -1 (nothing written) if a value is NaN or
 * infinite, or (sqrt) negative. */
int mt_q8_encode_signed(const float *x, size_t n, uint8_t *q, float *scale);
int mt_q8_encode_sqrt(const float *v, size_t n, uint8_t *q, float *scale);

/* The same codes and scale, the magnitudes rounded stochastically: up with
 * probability equal to the dropped fraction of a code step, from the 16
 * uniform random bits r[i] of each value (r = 0 truncates, 0xffff rounds up
 * whatever was dropped), so the expected code value is the value (to 2^-16
 * of a step: below the normal range the bits under 2^-16 of a step are
 * truncated first). A value that moves by less than half a step still moves
 * on average: rounding to nearest would keep it where it is. */
int mt_q8_encode_signed_sr(const float *x, size_t n, const uint16_t *r, uint8_t *q, float *scale);
int mt_q8_encode_sqrt_sr(const float *v, size_t n, const uint16_t *r, uint8_t *q, float *scale);

/* Back to values: x = code * scale; v = (code * scale)^2. */
void mt_q8_decode_signed(const uint8_t *q, size_t n, float scale, float *x);
void mt_q8_decode_sqrt(const uint8_t *q, size_t n, float scale, float *v);

/* One code's value in units of the scale (the signed or the sqrt code). */
float mt_q8_value_signed(uint8_t q);
float mt_q8_value_sqrt(uint8_t q);

#endif
