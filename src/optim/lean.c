/* The lean mode's AdamW step, scalar (lean.h). Built with -std=c11: no
 * contraction into fused multiply-adds, every operation rounds once, as in
 * the default mode's kernels. */
#include "optim/lean.h"
#include "core/bf16.h"
#include "optim/q16.h"
#include "optim/q8.h"

#include <math.h>
#include <string.h>

uint64_t mt_lean_random64(uint64_t seed, uint64_t step, uint64_t index)
{
    uint64_t z = seed ^ (step * 0x9E3779B97F4A7C15ull) ^ (index * 0xD1B54A32D192ED03ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; /* splitmix64's finaliser */
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint32_t mt_lean_random(uint64_t seed, uint64_t step, uint64_t index)
{
    return (uint32_t)(mt_lean_random64(seed, step, index) >> 48);
}

int mt_lean_step_block(const mt_adamw_hyper *h, uint64_t seed, uint64_t step, uint64_t index0, size_t n, int16_t *wq,
                       float *sw, const uint16_t *g, uint8_t *qm, float *sm, uint8_t *qv, float *sv)
{
    const mt_adamw_consts c = mt_adamw_consts_of(h);
    float m[MT_Q8_BLOCK], v[MT_Q8_BLOCK], p[MT_Q8_BLOCK];
    if (n > MT_Q8_BLOCK) return -1;
    mt_q8_decode_signed(qm, n, *sm, m);
    mt_q8_decode_sqrt(qv, n, *sv, v);
    mt_q16_decode(wq, n, *sw, p);
    for (size_t i = 0; i < n; i++) {
        const float gi = mt_bf16_to_f32(g[i]) * c.grad_scale;
        const float pi = p[i] * c.decay;
        m[i] = c.beta1 * m[i] + c.omb1 * gi;
        v[i] = c.beta2 * v[i] + c.omb2 * (gi * gi);
        const float denom = sqrtf(v[i]) * c.inv_sqrt_bc2 + c.eps;
        p[i] = pi - c.step * (m[i] / denom);
    }
    /* one hash per element: bits 0..15 round its m code, 16..31 its v code, 48..63 its weight */
    uint64_t z[MT_Q8_BLOCK];
    uint16_t rm[MT_Q8_BLOCK], rv[MT_Q8_BLOCK], rw[MT_Q8_BLOCK];
    for (size_t i = 0; i < n; i++) {
        z[i] = mt_lean_random64(seed, step, index0 + i);
        rm[i] = (uint16_t)(z[i] & 0xffffu), rv[i] = (uint16_t)((z[i] >> 16) & 0xffffu);
        rw[i] = (uint16_t)(z[i] >> 48);
    }
    uint8_t qm2[MT_Q8_BLOCK], qv2[MT_Q8_BLOCK];
    int16_t wq2[MT_Q8_BLOCK];
    float sm2, sv2, sw2;
    if (mt_q8_encode_signed_sr(m, n, rm, qm2, &sm2) || mt_q8_encode_sqrt_sr(v, n, rv, qv2, &sv2) ||
        mt_q16_encode_sr(p, n, rw, wq2, &sw2))
        return -1;
    memcpy(wq, wq2, n * sizeof *wq), memcpy(qm, qm2, n), memcpy(qv, qv2, n);
    *sw = sw2, *sm = sm2, *sv = sv2;
    return 0;
}

mt_lean_block_fn mt_lean_kernel(mt_adamw_isa isa)
{
    if (!mt_adamw_kernel(isa)) return NULL; /* out of range, or not on this CPU */
    switch (isa) {
    case MT_ADAMW_SCALAR:
        return mt_lean_step_block;
    case MT_ADAMW_AVX2:
        return mt_lean_step_block_avx2;
    case MT_ADAMW_AVX512:
    case MT_ADAMW_AVX512BF16: /* nothing in the step for the BF16 instructions to do */
        return mt_lean_step_block_avx512;
    default:
        return NULL;
    }
}
