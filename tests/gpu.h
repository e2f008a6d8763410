/* What a GPU test does where it finds no GPU. By default it skips, saying
 * why, so the suite passes on a machine without one (CI, a laptop). With
 * MT_REQUIRE_GPU=1 in the environment it fails instead: on the GPU machine a
 * missing device (no driver, a CUDA=0 build, a device hidden by
 * CUDA_VISIBLE_DEVICES) must not pass as a green run in which every GPU test
 * skipped. tests/require_gpu.sh checks both ways.
 *
 * Only for "there is no GPU (usable by this build)". A test that needs more
 * than one GPU still skips on a machine with just one. */
#ifndef MT_TESTS_GPU_H
#define MT_TESTS_GPU_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* 1 when MT_REQUIRE_GPU=1: a missing GPU fails the test. */
static inline int mt_gpu_required(void)
{
    const char *v = getenv("MT_REQUIRE_GPU");
    return v && strcmp(v, "1") == 0;
}

/* Ends the test for want of a GPU: skips it, or fails it under
 * MT_REQUIRE_GPU=1. The arguments are a message as for printf, the format a
 * string literal. */
#define MT_GPU_MISSING(...)                                                                                            \
    do {                                                                                                               \
        if (mt_gpu_required()) cr_assert_fail("MT_REQUIRE_GPU=1 but this test found no GPU: " __VA_ARGS__);          \
        else cr_skip_test(__VA_ARGS__);                                                                                \
    } while (0)

#endif
