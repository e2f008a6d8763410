/* Stand-ins for a build without CUDA (make CUDA=0): there is never a device. */
#include "device/device.h"

#ifndef MT_HAVE_CUDA
#include <stdio.h>

int mt_device_count(char *why, size_t why_len)
{
    if (why && why_len) snprintf(why, why_len, "this library was built without CUDA");
    return 0;
}

int mt_device_host_register(void *p, size_t n, char *why, size_t why_len)
{
    (void)p, (void)n;
    if (why && why_len) snprintf(why, why_len, "this library was built without CUDA");
    return -1;
}

void mt_device_host_unregister(void *p) { (void)p; }
int mt_device_use(int device) { (void)device; return -1; }
void mt_device_restore(int prev) { (void)prev; }
int mt_device_current(void) { return -1; }
int mt_device_numa_node(int device) { (void)device; return -1; }

int mt_device_mem_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    (void)device;
    *free_bytes = *total_bytes = 0;
    return -1;
}

int mt_device_name(int device, char *buf, size_t len)
{
    (void)device;
    if (buf && len) buf[0] = '\0';
    return -1;
}
#else
typedef int mt_cuda_host_none_unused; /* ISO C forbids an empty translation unit */
#endif
