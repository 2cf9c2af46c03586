"""The ranks' vote on a stop request (SIGTERM), without a host read of this step's device work.

A SIGTERM reaches the ranks at different moments; they must still stop after the same step,
or one rank saves a checkpoint (a collective) while the others enter the next step. So they
vote: an all_reduce MAX of each rank's pending signal. Reading the result on the host waits
for everything queued on the device before it, so a vote read in the step that cast it is a
sync on every step: the accelerator idles while the host waits, then the host idles while
the accelerator ramps up again.

So the vote is read one step late. After step k each rank casts its vote as a device
collective (nothing waits); after step k+1 it reads the vote of step k, which on an
accelerator came back to pinned host memory behind an event. The host then waits only for
step k's work, while step k+1's is already queued: the device never runs dry. Every rank
reads the same votes after the same steps, so they all stop after the same step, one later
than with a vote read at once.

On steps where the Trainer reads the device anyway (logging steps, the first step of a
process), the vote is read at once: the stop is then as prompt as before, and a resumed run
stopped during its load still stops after its first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime.signals import requested_signal

__all__ = ["StopVote"]


@dataclass
class _CastVote:
    """A vote in flight: the all_reduce's handle, its tensor, and (on an accelerator) its host copy's event."""

    work: dist.Work | None
    reduced: torch.Tensor
    host: torch.Tensor | None = None
    copied: torch.cuda.Event | None = None

    def result(self) -> int:
        if self.copied is not None and self.host is not None:
            self.copied.synchronize()  # the step that cast it is done; the one after it stays queued
            return int(self.host.item())
        if self.work is not None:
            self.work.wait()  # gloo: the all_reduce ran on the process group's thread meanwhile
        return int(self.reduced.item())


class StopVote:
    """Each step: the signal every rank agrees to stop on after this step (0: go on).

    In a single process there is nothing to agree on: the pending signal itself is the answer.
    """

    def __init__(self, device: torch.device, *, distributed: bool) -> None:
        self.device = device
        self.distributed = distributed and dist.is_available() and dist.is_initialized()
        self._pending: _CastVote | None = None
        # One pinned buffer for the host copy: a copy into pageable memory would not overlap.
        self._host = (torch.zeros(1, dtype=torch.int64, pin_memory=True)
                      if self.distributed and device.type == "cuda" else None)

    def after_step(self, *, read_now: bool) -> int:
        """The agreed signal to stop on after the step just finished, or 0.

        ``read_now`` must be the same on every rank (a logging step, the first step): the vote is then
        cast and read in this step; else this step's vote is cast and the previous step's is read."""

        local = requested_signal()
        if not self.distributed:
            return local
        previous = self._pending.result() if self._pending is not None else 0
        self._pending = None
        if read_now:
            return max(previous, self._cast(local).result())
        self._pending = self._cast(local)
        return previous

    def close(self) -> None:
        """Collect a vote still in flight (every rank cast it), so no collective is left behind."""

        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _cast(self, local: int) -> _CastVote:
        # torch.full fills on the device; torch.tensor([local], device=...) would copy from pageable
        # host memory, which waits for the device.
        vote = torch.full((1,), local, dtype=torch.int64, device=self.device)
        work = dist.all_reduce(vote, op=dist.ReduceOp.MAX, async_op=True)
        if self._host is None:
            return _CastVote(work, vote)
        if work is not None:
            work.wait()  # nccl: the current stream waits for the collective; the host does not
        self._host.copy_(vote, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return _CastVote(None, vote, self._host, copied)
