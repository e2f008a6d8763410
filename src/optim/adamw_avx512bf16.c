/* AdamW, AVX-512 with AVX512_BF16: the AVX-512 kernel, its bf16 rounding
 * done by VCVTNEPS2BF16 (_mm512_cvtneps_pbh). Same bits as every other
 * kernel. */
#define MT_ADAMW_NATIVE_BF16 1
#define MT_ADAMW_KERNEL mt_adamw_kernel_avx512bf16
#include "adamw_avx512.c"
