/* What the machine has: memory, CPUs, NUMA nodes. */
#ifndef MT_SYSINFO_H
#define MT_SYSINFO_H

#include <stdint.h>

/* Bytes the kernel reports as available for new allocations (MemAvailable). */
uint64_t mt_sys_mem_available(void);
/* Online CPUs. */
int mt_sys_ncpus(void);
/* Number of NUMA nodes the allocator can bind to (1 without NUMA support). */
int mt_sys_numa_nodes(void);
/* Fills cpus with up to max CPU ids of `node` (all online CPUs when node < 0
 * or NUMA is unavailable); returns how many. */
int mt_sys_node_cpus(int node, int *cpus, int max);

#endif
