/* The lean mode's AdamW step (docs/lean-optimizer.md): the weights kept as
 * 16-bit block codes (optim/q16.h) and the moments as 8-bit ones
 * (optim/q8.h), all three re-encoded each step with stochastic rounding. The scalar kernel is the
 * reference; the AVX2 and AVX-512 ones give the same bits (the random bits
 * are a function of the parameter's index, not of the lane). */
#ifndef MT_OPTIM_LEAN_H
#define MT_OPTIM_LEAN_H

#include "optim/adamw.h"

#include <stddef.h>
#include <stdint.h>

/* 64 random bits for parameter `index` at `step`: a counter-based hash
 * (splitmix64's finaliser), so a run (and a resumed run) draws the same bits
 * whatever the threads. The step uses bits 0..15 to round the parameter's m
 * code, 16..31 its v code and 48..63 its new weight; mt_lean_random gives
 * the last. */
uint64_t mt_lean_random64(uint64_t seed, uint64_t step, uint64_t index);
uint32_t mt_lean_random(uint64_t seed, uint64_t step, uint64_t index);

/* One block of n <= MT_Q8_BLOCK parameters, numbered index0.. in the model:
 * AdamW (docs/adamw.md's arithmetic, in fp32) on the weights decoded from
 * (wq, *sw) with the bf16 gradients g and the moments decoded from (qm, *sm)
 * and (qv, *sv); all three encoded back with stochastic rounding
 * (mt_q16_encode_sr, mt_q8_encode_signed_sr, mt_q8_encode_sqrt_sr). Returns
 * -1, writing nothing, when a new moment or weight is NaN or infinite (a NaN
 * or infinite gradient). */
int mt_lean_step_block(const mt_adamw_hyper *h, uint64_t seed, uint64_t step, uint64_t index0, size_t n, int16_t *wq,
                       float *sw, const uint16_t *g, uint8_t *qm, float *sm, uint8_t *qv, float *sv);

typedef int (*mt_lean_block_fn)(const mt_adamw_hyper *h, uint64_t seed, uint64_t step, uint64_t index0, size_t n,
                                int16_t *wq, float *sw, const uint16_t *g, uint8_t *qm, float *sm, uint8_t *qv,
                                float *sv);

/* The same step on AVX2 and AVX-512 (F, BW, VL, DQ): only call one after
 * mt_lean_kernel said this CPU has it. */
int mt_lean_step_block_avx2(const mt_adamw_hyper *h, uint64_t seed, uint64_t step, uint64_t index0, size_t n,
                            int16_t *wq, float *sw, const uint16_t *g, uint8_t *qm, float *sm, uint8_t *qv, float *sv);
int mt_lean_step_block_avx512(const mt_adamw_hyper *h, uint64_t seed, uint64_t step, uint64_t index0, size_t n,
                              int16_t *wq, float *sw, const uint16_t *g, uint8_t *qm, float *sm, uint8_t *qv,
                              float *sv);

/* The kernel of isa (MT_ADAMW_AVX512BF16 gives the AVX-512 one); NULL when
 * this CPU cannot run it or isa is out of range. */
mt_lean_block_fn mt_lean_kernel(mt_adamw_isa isa);

#endif
