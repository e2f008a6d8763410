/* The tests' pseudo-random numbers: splitmix64 from a seed, so that every
 * test draws the same inputs on every run. One generator per test file
 * (Criterion runs each test in its own process). */
#ifndef MT_TESTS_RNG_H
#define MT_TESTS_RNG_H

#include <stdint.h>

static uint64_t rng_state;

static inline void seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }

static inline uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
