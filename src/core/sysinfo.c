#define _GNU_SOURCE
#include "core/sysinfo.h"

#include <numa.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

uint64_t mt_sys_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                fclose(f);
                return (uint64_t)kb * 1024;
            }
        fclose(f);
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
}

int mt_sys_ncpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int mt_sys_numa_nodes(void)
{
    if (numa_available() < 0) return 1;
    int n = numa_max_node() + 1;
    return n > 0 ? n : 1;
}

int mt_sys_node_cpus(int node, int *cpus, int max)
{
    cpu_set_t allowed;
    int have_mask = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
    int n = 0;
    if (node >= 0 && numa_available() >= 0 && node <= numa_max_node()) {
        struct bitmask *bm = numa_allocate_cpumask();
        if (bm && numa_node_to_cpus(node, bm) == 0) {
            for (unsigned c = 0; c < bm->size && n < max; c++)
                if (numa_bitmask_isbitset(bm, c) && (!have_mask || CPU_ISSET(c, &allowed))) cpus[n++] = (int)c;
        }
        if (bm) numa_free_cpumask(bm);
        if (n > 0) return n;
    }
    int ncpu = mt_sys_ncpus();
    for (int c = 0; c < CPU_SETSIZE && n < max && n < ncpu; c++)
        if (!have_mask || CPU_ISSET(c, &allowed)) cpus[n++] = c;
    return n;
}
