/* The device layer: the one place where code outside cuda/ reaches the GPU
 * runtime. Discovery (is there a device, what is it, how much memory is
 * free), placement (the calling thread's current device), page-locking host
 * memory, and the synchronous memory calls that tests, benchmarks and set-up
 * code need (allocate, copy, fill, wait). Plain C: the CUDA toolkit's headers
 * stay under cuda/. Implemented in cuda/runtime/device.cu when the library
 * is built with CUDA, and by stand-ins (src/device/device_none.c) that
 * report no device otherwise.
 *
 * Conventions
 * - A call that can fail returns 0 on success and -1 on failure. Where it
 *   takes why and why_len, a failure writes a sentence saying what went
 *   wrong to why (NULL or why_len 0: nothing written).
 * - Nothing aborts, prints or throws, and every call is safe on a machine
 *   without a driver or device: it then fails (or reports no device). The
 *   runtime's last-error state is cleared after a failure, so one failed
 *   call does not make the next launch look failed.
 * - Memory calls work on the calling thread's current device (mt_device_use
 *   picks it). Device pointers are plain void *.
 * - Built without CUDA, mt_device_count reports 0 and every call with work
 *   to do fails with "this library was built without CUDA". */
#ifndef MT_DEVICE_H
#define MT_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- discovery and placement ---------------------------------------------------- */

/* Number of usable CUDA devices; 0 when there is no driver or device, and
 * then the reason goes to why. */
int mt_device_count(char *why, size_t why_len);
/* The NUMA node the device's PCI slot hangs off; -1 when unknown. */
int mt_device_numa_node(int device);
/* Free and total device memory in bytes; 0 on success (else both 0 and -1). */
int mt_device_mem_info(int device, size_t *free_bytes, size_t *total_bytes);
/* "NVIDIA H200 (sm_90, 139.8 GiB)" style description; 0 on success (else
 * buf is the empty string and -1). */
int mt_device_name(int device, char *buf, size_t len);
/* Makes device the calling thread's current device and returns the one that
 * was current, for mt_device_restore; -1 (nothing changed) without
 * CUDA or when the switch fails. The library works on the policy's device
 * between the two and leaves the caller's thread as it found it. */
int mt_device_use(int device);
void mt_device_restore(int prev);
/* The calling thread's current device; -1 without CUDA. */
int mt_device_current(void);

/* ---- host memory ------------------------------------------------------------------- */

/* Page-locks [p, p + n) for fast DMA, for every device; 0 on success. */
int mt_device_host_register(void *p, size_t n, char *why, size_t why_len);
void mt_device_host_unregister(void *p);

/* ---- device memory (synchronous; for tests, benchmarks and set-up) -------------------- */

/* *p = bytes of device memory (cudaMalloc: 256-byte aligned, contents
 * undefined); *p = NULL on failure. bytes == 0 gives *p = NULL and 0. */
int mt_device_malloc(void **p, size_t bytes, char *why, size_t why_len);
/* Frees what mt_device_malloc gave; NULL is ignored. */
void mt_device_free(void *p);
/* Blocking copies of bytes from host to device and from device to host
 * (the host memory need not be pinned). bytes == 0 does nothing and
 * succeeds. An error left by earlier asynchronous work (a failed kernel)
 * also surfaces here. */
int mt_device_copy_h2d(void *dst, const void *src, size_t bytes, char *why, size_t why_len);
int mt_device_copy_d2h(void *dst, const void *src, size_t bytes, char *why, size_t why_len);
/* Sets bytes of device memory at p to the byte value and waits for it;
 * bytes == 0 does nothing and succeeds. */
int mt_device_memset(void *p, int byte, size_t bytes, char *why, size_t why_len);
/* Waits for all work on the current device, on every stream; -1 when any of
 * it failed (the reason names the error). */
int mt_device_sync(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
