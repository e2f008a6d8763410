/* The part of the CUDA runtime the host side needs: is there a device, pin
 * host memory, where is the device. Implemented in cuda/ when the library is
 * built with CUDA, and by stubs that report no device otherwise. Each call is
 * safe without a driver: it then reports no device. */
#ifndef MT_CUDA_HOST_H
#define MT_CUDA_HOST_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no driver or device. The
 * reason, when there are none, goes to why (may be NULL, size why_len). */
int mt_device_count(char *why, size_t why_len);
/* Page-locks [p, p + n) for fast DMA; 0 on success, else writes the reason. */
int mt_device_host_register(void *p, size_t n, char *why, size_t why_len);
void mt_device_host_unregister(void *p);
/* The NUMA node the device's PCI slot hangs off; -1 when unknown. */
int mt_device_numa_node(int device);
/* Free and total device memory in bytes; 0 on success. */
int mt_device_mem_info(int device, size_t *free_bytes, size_t *total_bytes);
/* "NVIDIA H200 (sm_90, 139.8 GiB)" style description; 0 on success. */
int mt_device_name(int device, char *buf, size_t len);
/* Makes device the calling thread's current device and returns the one that
 * was current, for mt_device_restore; -1 (nothing changed) without
 * CUDA or when the switch fails. The library works on the policy's device
 * between the two and leaves the caller's thread as it found it. */
int mt_device_use(int device);
void mt_device_restore(int prev);
/* The calling thread's current device; -1 without CUDA. */
int mt_device_current(void);

#ifdef __cplusplus
}
#endif

#endif
