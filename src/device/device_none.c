/* The device layer's stand-ins for a build without CUDA (make CUDA=0): there
 * is never a device, and every call with work to do fails, saying why. */
#include "device/device.h"

#ifndef MT_HAVE_CUDA
#include <stdio.h>

static int no_cuda(char *why, size_t why_len)
{
    if (why && why_len) snprintf(why, why_len, "this library was built without CUDA");
    return -1;
}

int mt_device_count(char *why, size_t why_len)
{
    no_cuda(why, why_len);
    return 0;
}

int mt_device_host_register(void *p, size_t n, char *why, size_t why_len)
{
    (void)p, (void)n;
    return no_cuda(why, why_len);
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

int mt_device_malloc(void **p, size_t bytes, char *why, size_t why_len)
{
    *p = NULL;
    return bytes ? no_cuda(why, why_len) : 0;
}

void mt_device_free(void *p) { (void)p; }

int mt_device_copy_h2d(void *dst, const void *src, size_t bytes, char *why, size_t why_len)
{
    (void)dst, (void)src;
    return bytes ? no_cuda(why, why_len) : 0;
}

int mt_device_copy_d2h(void *dst, const void *src, size_t bytes, char *why, size_t why_len)
{
    (void)dst, (void)src;
    return bytes ? no_cuda(why, why_len) : 0;
}

int mt_device_memset(void *p, int byte, size_t bytes, char *why, size_t why_len)
{
    (void)p, (void)byte;
    return bytes ? no_cuda(why, why_len) : 0;
}

int mt_device_sync(char *why, size_t why_len) { return no_cuda(why, why_len); }
#else
typedef int mt_device_none_unused; /* ISO C forbids an empty translation unit */
#endif
