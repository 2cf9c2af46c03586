"""``[profiling]``: torch.profiler traces per rank, a per-step breakdown, CUDA memory snapshots.

Steps ``start_step .. start_step + steps - 1`` run under ``torch.profiler``; when the
window closes every rank writes ``<folder>/rank<R>/trace.json`` (Chrome trace-event
JSON, which Perfetto and chrome://tracing open) and ``breakdown.json``, and rank 0
prints one line: the mean time per step in forward, backward, optimizer, data and
communication. The phases are the trainer's ``phase("forward")``... ranges; the
communication figure is the time spent in collective calls (c10d ops; on CUDA the
NCCL kernels' device time), which overlaps the other phases when FSDP prefetches.
On CUDA the compute phases are device time: CUDA events recorded around forward, backward and
optimizer on the current stream, read when the window closes (host time there is only the time
to queue kernels); data stays host time.

Outside the window nothing is recorded: ``phase`` returns a shared null context,
so profiling off costs one attribute check per phase (benchmarks/profiling_overhead.py).

On CUDA, ``memory_snapshot=true`` records the allocator's history from the first
step and dumps ``memory_snapshot.pickle`` (open it at https://pytorch.org/memory_viz)
when the window closes, and ``memory_snapshot_oom.pickle`` if an allocation fails.
Memory snapshots are CUDA-only: torch's allocator history does not exist on CPU.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config.sections import ProfilingSection
from ..console import progress
from ..runtime.torch_compat import attach_out_of_memory_observer, dump_memory_snapshot, record_memory_history

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEventAvg

PHASES = ("forward", "backward", "optimizer", "data")
_LABEL = "titan/"
_COMM_MARKERS = ("c10d::", "nccl", "gloo", "all_gather", "allgather", "reduce_scatter", "allreduce", "all_reduce")
_NULL = contextlib.nullcontext()


class StepProfiler:
    """Starts and stops torch.profiler around the configured steps; the trainer calls it each step."""

    def __init__(self, config: ProfilingSection, *, run_dir: Path, rank: int, device: torch.device,
                 is_rank0: bool) -> None:
        self.config = config
        self.folder = run_dir / config.folder / f"rank{rank}"
        self.device = device
        self.is_rank0 = is_rank0
        self._prof: Any = None
        self._step_range: Any = None  # the open titan/step#N range: one per profiled step in the trace
        self._done = False
        self._device_ranges: list[tuple[str, Any, Any]] = []  # (phase, start event, end event) on CUDA
        self.snapshots = config.enable and config.memory_snapshot and device.type == "cuda"
        if config.enable and config.memory_snapshot and device.type != "cuda" and is_rank0:
            progress("profiling.memory_snapshot is CUDA-only (torch's allocator history): no snapshot on "
                     f"{device.type}", is_rank0=True)
        if self.snapshots:
            self.folder.mkdir(parents=True, exist_ok=True)
            record_memory_history(config.memory_snapshot_entries)
            # torch's hook for "dump a snapshot on OOM" (documented with the memory visualizer)
            attach_out_of_memory_observer(self._on_out_of_memory)

    def check_window(self, *, first_step: int, last_step: int) -> None:
        """Say (once, rank 0) when the profiled steps lie outside the steps this run will train: a window
        after the last step, or before a resume point, would otherwise produce no trace and no word."""
        c = self.config
        if not c.enable:
            return
        start, end = c.start_step, c.start_step + c.steps - 1
        if end < first_step or start > last_step:
            where = (f"before this run's first step {first_step} (it resumes from step {first_step - 1})"
                     if end < first_step else f"after this run's last step {last_step} (training.steps)")
            progress(f"profiling: steps {start}..{end} (profiling.start_step, profiling.steps) lie {where}: no "
                     f"trace will be written. Move profiling.start_step into {first_step}..{last_step}.",
                     is_rank0=self.is_rank0)

    @property
    def active(self) -> bool:
        return self._prof is not None

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A named range in the trace while profiling; a null context otherwise (no cost)."""
        if self._prof is None:
            return _NULL
        if self.device.type == "cuda" and name != "data":  # waiting for batches is host time
            return DeviceRange(name, self._device_ranges, lambda: torch.cuda.Event(enable_timing=True))
        return torch.profiler.record_function(_LABEL + name)

    def before_step(self, step: int) -> None:
        """``step`` is the 1-based step about to run."""
        c = self.config
        if self._prof is not None:
            self._open_step(step)
        if not c.enable or self._done or self._prof is not None or step != c.start_step:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities, record_shapes=c.record_shapes,
                                            with_stack=False, profile_memory=False)
        self._prof.start()
        self._open_step(step)

    def _open_step(self, step: int) -> None:
        self._step_range = torch.profiler.record_function(f"{_LABEL}step#{step}")
        self._step_range.__enter__()

    def after_step(self, step: int, *, last: bool) -> None:
        """``step`` is the 1-based step that just finished; the window closes after its last step."""
        if self._prof is None:
            return
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        if step >= self.config.start_step + self.config.steps - 1 or last:
            self._finish(steps=step - self.config.start_step + 1)

    def _finish(self, *, steps: int) -> None:
        prof, self._prof, self._done = self._prof, None, True
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        trace = self.folder / "trace.json"
        prof.export_chrome_trace(str(trace))
        per_step = breakdown(prof.key_averages(), steps=steps, cuda=self.device.type == "cuda")
        if self._device_ranges:  # CUDA: the phases' device time replaces their host time
            per_step.update(device_phase_ms(self._device_ranges, steps=steps))
            self._device_ranges = []
        (self.folder / "breakdown.json").write_text(json.dumps({"steps": steps, "ms_per_step": per_step}, indent=1))
        parts = " | ".join(f"{k} {v:.1f}ms" for k, v in per_step.items())
        progress(f"profile of steps {self.config.start_step}-{self.config.start_step + steps - 1}: {parts} "
                 f"per step; traces in {self.folder.parent}", is_rank0=self.is_rank0)
        if self.snapshots:
            self.dump_snapshot("memory_snapshot.pickle")

    def dump_snapshot(self, name: str) -> Path:
        path = self.folder / name
        dump_memory_snapshot(str(path))
        return path

    def _on_out_of_memory(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        path = self.dump_snapshot("memory_snapshot_oom.pickle")
        progress(f"out of memory on cuda:{device}: memory snapshot written to {path}", is_rank0=True)

    def close(self) -> None:
        """Stop a window the run did not finish (stopped early) and the allocator history."""
        if self._prof is not None:
            self._prof.stop()
            self._prof = None
        if self.snapshots:
            record_memory_history(None)


class DeviceRange(contextlib.AbstractContextManager[None]):
    """A phase's trace range plus two device events around it, kept in ``ranges`` to be read later."""

    def __init__(self, name: str, ranges: list[tuple[str, Any, Any]], new_event: Callable[[], Any]) -> None:
        self.name, self.ranges, self.new_event = name, ranges, new_event
        self._range: Any = None
        self._start: Any = None

    def __enter__(self) -> None:
        self._range = torch.profiler.record_function(_LABEL + self.name)
        self._range.__enter__()
        self._start = self.new_event()
        self._start.record()

    def __exit__(self, *exc: object) -> None:
        end = self.new_event()
        end.record()
        self.ranges.append((self.name, self._start, end))
        self._range.__exit__(*exc)


def device_phase_ms(ranges: Iterable[tuple[str, Any, Any]], *, steps: int) -> dict[str, float]:
    """Mean device milliseconds per step of each phase, from (phase, start, end) events (synchronized)."""
    totals: dict[str, float] = {}
    for name, start, end in ranges:
        totals[name] = totals.get(name, 0.0) + float(start.elapsed_time(end))
    return {name: total / max(steps, 1) for name, total in totals.items()}


def breakdown(averages: Iterable[FunctionEventAvg], *, steps: int, cuda: bool) -> dict[str, float]:
    """Mean milliseconds per step of each phase, and of collectives (device time on CUDA), from the rows of
    torch's ``profile.key_averages()``."""
    totals = {name: 0.0 for name in (*PHASES, "communication")}
    for event in averages:
        key = str(event.key)
        if key.startswith(_LABEL) and key[len(_LABEL):] in totals:
            totals[key[len(_LABEL):]] += float(event.cpu_time_total)
        elif any(marker in key.lower() for marker in _COMM_MARKERS):
            device_time = float(getattr(event, "device_time_total", 0.0) or 0.0)
            # Host-side time of a collective on gloo; on CUDA the kernel time is what is measured.
            totals["communication"] += device_time if cuda and device_time else float(event.self_cpu_time_total)
    return {name: total / 1000.0 / max(steps, 1) for name, total in totals.items()}


__all__ = ["PHASES", "DeviceRange", "StepProfiler", "breakdown", "device_phase_ms"]
