/* Counter-based random numbers: the value for (seed, stream, index) is a pure
 * function of the three, so tensors can be initialised in parallel chunks
 * and still come out identical whatever the thread count. */
#ifndef MT_RNG_H
#define MT_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint64_t mt_mix64(uint64_t z)
{ /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t mt_rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    return mt_mix64(mt_mix64(seed ^ mt_mix64(stream + 0x9e3779b97f4a7c15ull)) + index);
}

/* A standard normal variate (Box-Muller on the two halves of one draw). */
static inline double mt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t r = mt_rng_u64(seed, stream, index);
    double u1 = ((double)(r >> 32) + 0.5) * (1.0 / 4294967296.0); /* (0, 1) */
    double u2 = (double)(r & 0xffffffffu) * (1.0 / 4294967296.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
