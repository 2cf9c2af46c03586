"""training.cpu_malloc_tuning's glibc settings (runtime/cpu_allocator.py): with them, threads that allocate share
one malloc arena, so what a collective's thread frees the training thread reuses (docs/benchmarks.md, issue 36)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import ctypes, sys, threading
    from titan_core.runtime.cpu_allocator import keep_freed_memory_in_heap
    if sys.argv[1] == "tuned":
        assert keep_freed_memory_in_heap()
    def allocate():
        blocks = [bytearray(4 << 20) for _ in range(4)]  # 4 MiB blocks: malloc'ed, in this thread's arena
        del blocks
    threads = [threading.Thread(target=allocate) for _ in range(3)]
    for t in threads: t.start()
    for t in threads: t.join()
    ctypes.CDLL(None).malloc_stats()  # one "Arena N:" paragraph per arena, on stderr
""")


def arenas(mode: str) -> int:
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})
    assert proc.returncode == 0, proc.stderr
    return sum(line.startswith("Arena ") for line in proc.stderr.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings exist on Linux only")
def test_the_tuning_keeps_every_thread_in_one_arena() -> None:
    assert arenas("plain") > 1  # glibc's default: threads that allocate get arenas of their own
    assert arenas("tuned") == 1
