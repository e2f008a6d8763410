"""No growth over many steps: neither the process's memory (the library's
allocations and the package's ctypes objects) nor Python's heap."""
import gc
import tracemalloc

import megatrain

from conftest import TINY, pattern_batch


def rss_kib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource
    return pages * resource.getpagesize() // 1024


def test_no_growth_over_many_steps(tmp_path):
    tokens, targets = pattern_batch()
    with megatrain.Model(**TINY, optimizer_threads=1) as m:
        def work(n):
            for _ in range(n):
                m.step(tokens, targets)
                m.eval(tokens, targets)
                m.logits(tokens)
        work(50)  # warm-up: the allocator's pools, lazily built tables
        gc.collect()
        tracemalloc.start()
        rss0 = rss_kib()
        snap0 = tracemalloc.take_snapshot()
        work(400)
        gc.collect()
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snap0, "filename"))
        rss1 = rss_kib()
        tracemalloc.stop()
    # a leak of even one small object a step would show: 1200 calls
    assert grown < 64 * 1024, f"Python's heap grew by {grown} bytes over 1200 calls"
    assert rss1 - rss0 < 2048, f"the process grew by {rss1 - rss0} KiB over 1200 calls"


def test_models_come_and_go_without_growth():
    def cycle():
        for _ in range(20):
            with megatrain.Model(**TINY, abort=lambda: False, log=lambda level, text: None) as m:
                m.step(*pattern_batch())
    cycle()
    gc.collect()
    rss0 = rss_kib()
    cycle()
    cycle()
    gc.collect()
    assert rss_kib() - rss0 < 4096
