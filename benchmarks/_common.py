"""What the benchmark scripts share: their command line (run them as ``python benchmarks/<name>.py``), the
fixed-width table they print their figures in, and the CPU's nominal peak, the yardstick CPU MFU is
stated against beside the measured matmul rate."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def int_parser(doc: str | None, **defaults: int) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring, with one integer option per keyword:
    ``seq_len=2048`` gives ``--seq-len`` (default 2048). Add any other option to it."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return parser


class Table:
    """A fixed-width table printed line by line: each column's heading and alignment-and-width (``"<10"``:
    left in 10 characters, ``">15"``: right in 15) given once, for the heading line and every row."""

    def __init__(self, *columns: tuple[str, str]) -> None:
        self.widths = [width for _, width in columns]
        self.headings = [heading for heading, _ in columns]

    def print_header(self) -> None:
        self.print_row(*self.headings)

    def print_row(self, *cells: str) -> None:
        """One line: each cell (numbers already formatted, e.g. ``f"{seconds:.2f}"``) in its column's width."""
        print("".join(format(cell, width) for cell, width in zip(cells, self.widths, strict=True)))


def _cpu_flags_and_clock() -> tuple[set[str], float | None, str]:
    """(the CPU's feature flags, its clock in GHz or None, where the clock was read)."""
    flags: set[str] = set()
    mhz: float | None = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "cpu MHz" and mhz is None:
                mhz = float(value)
    except (OSError, ValueError):
        pass
    try:  # the nominal maximum, where the kernel exposes frequency scaling
        khz = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text())
        return flags, khz / 1e6, "sysfs cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    if mhz is not None:
        return flags, mhz / 1e3, "/proc/cpuinfo cpu MHz (the clock the kernel reports; no cpufreq in this machine)"
    return flags, None, "not readable"


def nominal_cpu_peak() -> dict[str, object]:
    """The CPU's nominal fp32 peak: cores x FLOP per cycle per core x clock.

    Convention (stated where it is printed): cores = the logical CPUs this process may run on;
    FLOP per cycle = SIMD fp32 lanes (16 with AVX-512, 8 with AVX2+FMA, 4 otherwise) x 2 (a
    fused multiply-add counts two) x 2 FMA units per core, the count on current x86 server
    cores; clock = sysfs's nominal maximum, else /proc/cpuinfo's reported clock. ``flops`` is
    None when the clock cannot be read."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    flags, ghz, clock_from = _cpu_flags_and_clock()
    lanes, isa = (16, "AVX-512") if "avx512f" in flags else (8, "AVX2+FMA") if {"avx2", "fma"} <= flags else (4, "SSE")
    per_cycle = lanes * 2 * 2
    return {"cores": cores, "isa": isa, "flop_per_cycle": per_cycle, "ghz": ghz, "clock_from": clock_from,
            "flops": cores * per_cycle * ghz * 1e9 if ghz else None}
