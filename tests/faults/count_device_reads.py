"""Test-only spy: counts, per training step, the reads on the host of values that live on the device.

Loaded with ``--import count_device_reads`` (``tests/faults`` on PYTHONPATH). On a CPU every
tensor is on the host, so "on the device" is followed the way an accelerator would see it:
a torch function mode, active inside ``Trainer.train_step``, tags the model's parameters and
buffers, every gradient read from a tagged tensor, every tensor a factory makes with an
explicit ``device=`` other than the string "cpu" (the trainer's device tensors), every ``.to(...)`` result, and every
output of an op that had a tagged input. A tagged tensor read on the host (``float()``,
``int()``, ``bool()``, ``.item()``, ``.tolist()``, ``.numpy()``) is a device sync on a GPU; its
step is counted. A loader's batch (host data by design) is not tagged until copied.

Each tag is the step whose work made the value (an op's output: the latest step among its
inputs). A read of a value made in the current step waits for that step's device work: a
``same`` read. A read of a value made in an earlier step (the ranks' stop vote, read one step
late) waits only for work the device finished while this step was queued: a ``lagged`` read.
The spy follows ``Trainer.train_step`` and ``Trainer.stop_if_signalled``. After each step the counts
are written as JSON ``{"same": {step: reads}, "lagged": {step: reads}}`` to
``TITAN_TEST_DEVICE_READS``, with ``.rank<N>`` appended on ranks other than 0.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from titan_core import Trainer

READS: Counter[int] = Counter()
LAGGED: Counter[int] = Counter()
_READ_NAMES = {"__float__", "__int__", "__bool__", "__index__", "item", "tolist", "numpy"}


class DeviceReads(TorchFunctionMode):
    def __init__(self, step: int, tagged: WeakIdKeyDictionary) -> None:
        super().__init__()
        self.step, self.tagged = step, tagged

    def _tag(self, value: Any, step: int) -> None:
        for leaf in tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                self.tagged[leaf] = step

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inputs = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        made_in = [self.tagged[t] for t in inputs if t in self.tagged]
        tagged_input = bool(made_in)
        if name in _READ_NAMES and tagged_input:
            (LAGGED if max(made_in) < self.step else READS)[self.step] += 1
            if os.environ.get("TITAN_TEST_DEVICE_READS_TRACE") == str(self.step):
                import traceback
                traceback.print_stack(limit=8)
        result = func(*args, **kwargs)
        # A gradient read from a tagged parameter is tagged through its tagged input.
        # device="cpu" spelled as a string is host by intent (torch's optimizers keep their step counts there).
        on_device = "device" in kwargs and kwargs["device"] != "cpu"
        if name not in _READ_NAMES and (tagged_input or on_device or name == "to"):
            self._tag(result, max(made_in) if made_in and not on_device and name != "to" else self.step)
        return result


_train_step = Trainer.train_step
_tagged = WeakIdKeyDictionary()


def train_step(self: Any, batches: Any) -> Any:
    for part in self.model_parts:
        for tensor in [*part.parameters(), *part.buffers()]:
            _tagged[tensor] = self.step + 1  # this step's optimizer writes them
    with DeviceReads(self.step + 1, _tagged):
        return _train_step(self, batches)


_stop_if_signalled = Trainer.stop_if_signalled


def stop_if_signalled(self: Any, **kwargs: Any) -> None:
    try:
        with DeviceReads(self.step, _tagged):  # called after the step count moved on
            _stop_if_signalled(self, **kwargs)
    finally:
        _write()  # after every step: a torchrun worker leaves with os._exit (runtime/worker_exit.py), no atexit


def _write() -> None:
    rank = int(os.environ.get("RANK", "0"))
    path = os.environ["TITAN_TEST_DEVICE_READS"] + (f".rank{rank}" if rank else "")
    with open(path, "w") as f:
        json.dump({"same": READS, "lagged": LAGGED}, f)


Trainer.train_step = train_step  # type: ignore[method-assign]
Trainer.stop_if_signalled = stop_if_signalled  # type: ignore[method-assign]
