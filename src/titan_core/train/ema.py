"""An exponential moving average (EMA) of the weights, kept beside them in float32 (``[ema]``).

After every ``interval``-th optimizer step: ``ema = decay * ema + (1 - decay) * weight``. The
average starts at the weights the run starts from (initialised, ``initial_load``, or a checkpoint
of a run without EMA), unless the checkpoint resumed from holds one.

Each average is laid out like its parameter: under FSDP2/TP each rank keeps the local shard of
its own parameter shard and updates it in place, nothing is gathered; the checkpoint's ``ema``
entry (:class:`EmaState`) presents those shards as DTensors with the parameter's mesh and
placements, so DCP saves each rank's shard and reshards on load as it does the optimizer state.

:meth:`WeightAverage.swapped_in` puts the averages into the model for a ``with`` block (an
evaluation, the export) and the trained weights back after it, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..checkpoint.stateful import EMA
from ..checkpoint.states import laid_out_like, named_parameters, plain_tensor
from ..config.sections import EmaSection
from ..errors import CheckpointError
from ..runtime.torch_compat import foreach_scaled_add_

# The scaled weights of one update are made this many bytes at a time (see WeightAverage.after_step).
GROUP_BYTES = 256 * 2**20


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank updates: a DTensor's local shard (a converter's wrapper unwrapped), sharing storage."""
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    plain = plain_tensor(local)
    assert isinstance(plain, torch.Tensor)
    return plain


class WeightAverage:
    """The EMA of every parameter of ``model_parts`` (canonical names, as the checkpoint keys the model)."""

    def __init__(self, model_parts: list[nn.Module], *, decay: float, interval: int) -> None:
        named = named_parameters(model_parts)
        self.names = [name for name, _ in named]
        self.params = [param for _, param in named]  # DTensors under FSDP2/TP: the layout the checkpoint keeps
        self.decay, self.interval = decay, interval
        self.averages = [torch.empty(tuple(w.shape), dtype=torch.float32, device=w.device) for w in self.weights()]
        self.started = False  # set when the averages hold a value: the starting weights or a checkpoint's EMA

    @classmethod
    def from_config(cls, section: EmaSection, model_parts: list[nn.Module]) -> WeightAverage | None:
        """The run's EMA, or None when ``[ema]`` sets no decay."""
        if section.decay is None:
            return None
        return cls(model_parts, decay=section.decay, interval=section.interval)

    def weights(self) -> list[torch.Tensor]:
        """This rank's share of every parameter (local shards), in the averages' order."""
        return [_local(p.detach()) for p in self.params]

    def start(self) -> None:
        """Before the first step of this process: the average starts at the weights, unless a checkpoint gave it."""
        if self.started:
            return
        with torch.no_grad():
            for average, weight in zip(self.averages, self.weights()):
                average.copy_(weight)
        self.started = True

    def after_step(self, step: int) -> None:
        """After optimizer step ``step`` (1-based): fold the weights in on every ``interval``-th step."""
        if step % self.interval:
            return
        with torch.no_grad():
            # Two products and a sum, each rounded once in float32: exactly the formula as written (an add
            # with alpha may fuse into one rounding on some kernels). The scaled weights are a temporary,
            # made a group of tensors at a time so that it never holds a whole copy of a large model.
            for averages, weights in _groups(self.averages, self.weights()):
                foreach_scaled_add_(averages, self.decay, [w.float() for w in weights], 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averages in the model's parameters inside the block; the trained weights restored after it,
        bit for bit (even when the block raises). Holds one extra copy of this rank's weights meanwhile."""
        weights = self.weights()
        with torch.no_grad():
            kept = [w.clone() for w in weights]
            for weight, average in zip(weights, self.averages):
                weight.copy_(average)
        try:
            yield
        finally:
            with torch.no_grad():
                for weight, original in zip(weights, kept):
                    weight.copy_(original)

    def state(self) -> EmaState:
        return EmaState(self)


class EmaState:
    """The checkpoint's ``ema`` entry (a ``Stateful``): ``ema.<fqn>``, float32, laid out like the parameter.

    A checkpoint without it (a run without EMA, or one written before EMA existed) still resumes: the
    average then starts from the loaded weights."""

    optional_in_checkpoint = True

    def __init__(self, ema: WeightAverage) -> None:
        self.ema = ema

    def state_dict(self) -> dict[str, Any]:
        e = self.ema
        return {name: laid_out_like(p, a) for name, p, a in zip(e.names, e.params, e.averages)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        e = self.ema
        values = [_checked(state_dict, name, like=a) for name, a in zip(e.names, e.averages)]
        with torch.no_grad():
            for average, value in zip(e.averages, values):
                average.copy_(value)
        e.started = True


def _groups(averages: list[torch.Tensor], weights: list[torch.Tensor], *, limit_bytes: int = GROUP_BYTES
            ) -> Iterator[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """(averages, weights) in consecutive groups of at most ``limit_bytes`` of averages (one tensor at least)."""
    start, size = 0, 0
    for i, average in enumerate(averages):
        nbytes = average.numel() * average.element_size()
        if i > start and size + nbytes > limit_bytes:
            yield averages[start:i], weights[start:i]
            start, size = i, 0
        size += nbytes
    if start < len(averages):
        yield averages[start:], weights[start:]


def _checked(state: dict[str, Any], name: str, *, like: torch.Tensor) -> torch.Tensor:
    """``state[name]`` as a local tensor shaped like ``like``, float32 and finite; else one message."""
    from torch.distributed.tensor import DTensor

    value = state.get(name)
    value = value.to_local() if isinstance(value, DTensor) else value
    if not isinstance(value, torch.Tensor) or value.shape != like.shape or value.dtype != like.dtype:
        got = f"{value.dtype}{list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise CheckpointError(
            f"the checkpoint's EMA tensor {EMA}.{name} is {got}, expected {like.dtype}{list(like.shape)}: it is damaged "
            "or from another model; resume from another checkpoint or start fresh with --checkpoint.resume=never.")
    if not bool(torch.isfinite(value).all()):
        raise CheckpointError(f"the checkpoint's EMA tensor {EMA}.{name} holds NaN or inf; resume from another "
                              "checkpoint or start fresh with --checkpoint.resume=never.")
    return value
