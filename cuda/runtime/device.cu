// The device layer on the CUDA runtime (src/device/device.h for the
// contract): device discovery and placement, pinning host memory, and the
// synchronous device-memory calls. Every function reports failure instead of
// throwing or aborting, clears the runtime's last-error state after one, and
// works (reporting no device) on a machine without a driver.
#include "device/device.h"

#include <cuda_runtime.h>
#include <stdio.h>

static void say(char *why, size_t len, const char *what, cudaError_t e)
{
    if (why && len) snprintf(why, len, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

extern "C" int mt_device_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        say(why, why_len, "no CUDA device", e);
        cudaGetLastError(); // reset the runtime's last-error state
        return 0;
    }
    if (n == 0 && why && why_len) snprintf(why, why_len, "the CUDA driver reports no device");
    return n;
}

extern "C" int mt_device_host_register(void *p, size_t n, char *why, size_t why_len)
{
    // portable: pinned for every device's context, not only the current one
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        say(why, why_len, "cudaHostRegister", e);
        cudaGetLastError();
        return -1;
    }
    return 0;
}

extern "C" void mt_device_host_unregister(void *p)
{
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

extern "C" int mt_device_numa_node(int device)
{
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    for (char *c = bus; *c; c++)
        if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
    char path[96];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
    return node;
}

extern "C" int mt_device_use(int device)
{
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (prev != device && cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return prev;
}

extern "C" void mt_device_restore(int prev)
{
    if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess) cudaGetLastError();
}

extern "C" int mt_device_current(void)
{
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return d;
}

extern "C" int mt_device_mem_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}

extern "C" int mt_device_name(int device, char *buf, size_t len)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        cudaGetLastError();
        if (buf && len) buf[0] = '\0';
        return -1;
    }
    snprintf(buf, len, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor, (double)p.totalGlobalMem / (1u << 30));
    return 0;
}

// ---- device memory ---------------------------------------------------------------

// 0, or -1 with the reason in why and the runtime's last error cleared.
static int done(cudaError_t e, char *why, size_t len, const char *what)
{
    if (e == cudaSuccess) return 0;
    say(why, len, what, e);
    cudaGetLastError();
    return -1;
}

extern "C" int mt_device_malloc(void **p, size_t bytes, char *why, size_t why_len)
{
    *p = nullptr;
    if (bytes == 0) return 0;
    char what[64];
    snprintf(what, sizeof what, "cudaMalloc of %zu bytes", bytes);
    if (done(cudaMalloc(p, bytes), why, why_len, what)) {
        *p = nullptr;
        return -1;
    }
    return 0;
}

extern "C" void mt_device_free(void *p)
{
    if (p && cudaFree(p) != cudaSuccess) cudaGetLastError();
}

extern "C" int mt_device_copy_h2d(void *dst, const void *src, size_t bytes, char *why, size_t why_len)
{
    if (bytes == 0) return 0;
    return done(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), why, why_len, "copy to the device");
}

extern "C" int mt_device_copy_d2h(void *dst, const void *src, size_t bytes, char *why, size_t why_len)
{
    if (bytes == 0) return 0;
    return done(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), why, why_len, "copy from the device");
}

extern "C" int mt_device_memset(void *p, int byte, size_t bytes, char *why, size_t why_len)
{
    if (bytes == 0) return 0;
    if (done(cudaMemset(p, byte, bytes), why, why_len, "cudaMemset")) return -1;
    // cudaMemset of device memory may return before it has run
    return done(cudaStreamSynchronize(0), why, why_len, "cudaMemset");
}

extern "C" int mt_device_sync(char *why, size_t why_len)
{
    return done(cudaDeviceSynchronize(), why, why_len, "device work");
}
