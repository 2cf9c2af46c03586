"""What one micro-batch's forward keeps for backward, per block, measured on the meta device.

The whole model runs one forward on meta (no memory, no arithmetic) with a
``saved_tensors_hooks`` that records every tensor autograd keeps; forward hooks on each
block attribute them to it. Tensors are counted once per storage (a view saved twice is one
buffer) and parameters not at all (they are counted as weights). A dispatch mode notes, per
block, the outputs of the operators that per-op selective checkpointing keeps, so each
activation-checkpointing mode's figure comes from the same pass:

* ``none``: everything saved;
* ``full``: the block's input (recomputed from it in backward; one block's ``none`` figure is
  live again during its recompute, counted by the plan as the recompute peak);
* ``selective`` per-op: the block's input plus the saved ops' outputs (every other matmul).

Each matmul's saved input and kept output are also noted by the weight it multiplies (its name in
the block), so the plan can tell what tensor parallelism keeps whole: the inputs of column-parallel
linears (gathered from the sequence shards for the matmul and saved so) and the outputs of
row-wise ones (full partial sums before their reduce-scatter).

Attention is counted as a fused kernel runs it (flash on CUDA, the fused kernels on CPU): on meta
torch takes SDPA's reference path, which keeps the ``[.., seq, seq]`` score matrices; no fused
kernel stores them, so tensors whose last two sizes are both the sequence length are left out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..parallel.checkpointing import block_structure, saves_nothing
from ..parallel.pipeline import discard_forward_records
from ..runtime.torch_compat import dispatch_mode_class, grouped_mm_op

# Ops whose outputs per-op selective checkpointing keeps besides the matmuls: the attention
# kernels (by name: SDPA's, flash, and a plugin's own fused one) and the reductions used for amax.
_SAVED_NAME_PARTS = ("attention", "flash")
_MATMULS = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten._grouped_mm.default")


@dataclass
class BlockActivations:
    """Bytes one micro-batch leaves saved by one block, per AC mode."""

    saved: int = 0  # everything (AC none)
    input_bytes: int = 0  # the block's input (AC full keeps only this)
    selective_ops: int = 0  # outputs of the ops per-op selective AC keeps
    # by the weight's name in the block: the storage of the matmul's input, and the bytes of its output
    # when per-op selective AC keeps it
    matmul_inputs: dict[str, int] = field(default_factory=dict, repr=False)
    kept_matmul_outputs: dict[str, int] = field(default_factory=dict, repr=False)
    _storages: dict[int, int] = field(default_factory=dict, repr=False)  # saved storage -> bytes
    # The block's latest ``aten.mm`` as (the bytes it kept, its weight's name), and whether an op after it may
    # save a tensor (the policy's own test, ``parallel.checkpointing.saves_nothing``).
    _last_mm: tuple[int, str | None] = field(default=(0, None), repr=False)
    _saves_after_last_mm: bool = field(default=True, repr=False)

    def forget_unread_last_matmul(self) -> None:
        """Per-op selective AC keeps no output of the block's last ``aten.mm`` when only sums, views, casts and
        collectives follow it; see ``parallel.checkpointing._LastMatmul``."""
        kept, weight = self._last_mm
        if kept and not self._saves_after_last_mm:
            self.selective_ops -= kept
            if weight is not None:
                self.kept_matmul_outputs.pop(weight, None)

    def saved_inputs_of(self, weights: AbstractSet[str]) -> int:
        """Bytes of the saved matmul inputs of ``weights`` (names in the block), each storage once."""
        keys = {key for name, key in self.matmul_inputs.items() if name in weights}
        return sum(self._storages.get(key, 0) for key in keys)

    def kept_outputs_of(self, weights: AbstractSet[str]) -> int:
        """Bytes of the outputs of ``weights``' matmuls that per-op selective AC keeps."""
        return sum(n for name, n in self.kept_matmul_outputs.items() if name in weights)

    @property
    def largest_saved(self) -> int:
        """Bytes of the block's largest saved tensor (the size of the biggest gradient its backward makes)."""
        return max(self._storages.values(), default=0)


@dataclass(frozen=True)
class ActivationProbe:
    """Per-block figures by block name, and the bytes outside the blocks (embedding, final norm, head)."""

    blocks: dict[str, BlockActivations]
    outside: int
    logits_bytes: int


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _nbytes(t: torch.Tensor) -> int:
    return int(t.untyped_storage().nbytes())


_DispatchMode = dispatch_mode_class()


class _OpOutputs(_DispatchMode):  # type: ignore[misc,valid-type]
    """Adds to the current block's ``selective_ops`` the outputs of the ops selective AC keeps."""

    def __init__(self, probe: _Recorder) -> None:
        super().__init__()
        self.probe = probe
        self.mm_count = 0  # per block, as the policy counts
        self.counted: BlockActivations | None = None
        self.grouped_mm = _grouped_mm_op_default()  # looked up once: every op of the probe is compared with it

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.bincount.default and args[0].is_meta:
            # MoE routing counts tokens per expert: values meta cannot know; only the size matters here
            # (the grouped matmuls take the counts as offsets, their shapes do not depend on them).
            minlength = int((kwargs or {}).get("minlength", args[2] if len(args) > 2 else 0))
            return torch.empty((minlength,), dtype=torch.long, device="meta")
        if func is self.grouped_mm and args[0].is_meta and args[0].dtype != torch.bfloat16:
            out = _grouped_mm_shape(func, args, kwargs or {})
        else:
            out = func(*args, **(kwargs or {}))
        block = self.probe.current
        if block is not None:
            name = str(func)
            keep = False
            if name in _MATMULS:
                if block is not self.counted:
                    self.counted, self.mm_count = block, 0
                self.mm_count += 1  # the score matmuls count too: SAC's policy sees them as matmuls
                keep = self.mm_count % 2 == 1  # every other matmul is recomputed
            elif any(part in name for part in _SAVED_NAME_PARTS) and "backward" not in name:
                keep = True
            weight = self.probe.weight_of(func, args)
            if weight is not None:
                block.matmul_inputs[weight] = _storage_key(args[-2])
            kept = 0
            if keep:
                leaves = _tensors(out)
                kept = sum(_nbytes(t) for t in leaves
                           if isinstance(t, torch.Tensor) and not self.probe.is_score_matrix(t))
                block.selective_ops += kept
                if weight is not None:
                    block.kept_matmul_outputs[weight] = kept
            if name == "aten.mm.default":
                block._last_mm, block._saves_after_last_mm = (kept, weight), False
            elif not saves_nothing(func):
                block._saves_after_last_mm = True
        return out


def _grouped_mm_op_default() -> Any:
    """``aten._grouped_mm.default``, or None on a torch without it."""
    packet = grouped_mm_op()
    return None if packet is None else packet.default


def _grouped_mm_shape(func: Any, args: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    """The grouped GEMM's output on meta for float32 operands (a CPU run's experts).

    torch's meta kernel applies the CUDA kernel's dtype rule (bfloat16 only) and refuses float32, while
    the CPU kernel takes it. The output's shape does not depend on the dtype: ask the kernel in bfloat16,
    answer in the operands' dtype (the bytes the probe counts)."""
    as_bf16 = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    shaped = func(*as_bf16, **kwargs)
    return torch.empty(shaped.shape, dtype=kwargs.get("out_dtype") or args[0].dtype, device="meta")


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _tensors(item)]
    return []


class _Recorder:
    def __init__(self, model: nn.Module, block_names: list[str], blocks_attr: str, seq_len: int) -> None:
        self.seq_len = seq_len
        self.param_storages = {_storage_key(p) for p in model.parameters()}
        self.blocks = {name: BlockActivations() for name in block_names}
        self.outside = 0
        self.outside_storages: set[int] = set()
        self.current: BlockActivations | None = None
        self.blocks_attr = blocks_attr
        self.weight_names: dict[int, str] = {}  # a block weight's storage -> its name in the block

    def name_weights(self, blocks: nn.Module) -> None:
        self.weight_names = {_storage_key(p): name for _, block in blocks.named_children()
                             for name, p in block.named_parameters()}

    def weight_of(self, func: Any, args: Any) -> str | None:
        """The block weight a 2-D matmul (``mm(x, w.t())``, ``addmm(b, x, w.t())``) multiplies, if any."""
        if str(func) not in ("aten.mm.default", "aten.addmm.default") or len(args) < 2:
            return None
        weight = args[-1]
        return self.weight_names.get(_storage_key(weight)) if isinstance(weight, torch.Tensor) else None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key in self.param_storages or self.is_score_matrix(t):
            return t
        target = self.current
        if target is None:
            if key not in self.outside_storages:
                self.outside_storages.add(key)
                self.outside += _nbytes(t)
        elif key not in target._storages:
            target._storages[key] = _nbytes(t)
            target.saved += target._storages[key]
        return t

    def is_score_matrix(self, t: torch.Tensor) -> bool:
        return t.dim() >= 2 and t.shape[-1] == t.shape[-2] == self.seq_len

    @contextlib.contextmanager
    def hooks(self, model: nn.Module) -> Iterator[None]:
        handles = []
        blocks = model.get_submodule(self.blocks_attr)
        for name, block in blocks.named_children():
            record = self.blocks[name]

            def pre(_m: nn.Module, args: tuple[Any, ...], record: BlockActivations = record) -> None:
                self.current = record
                first = args[0] if args else None
                if isinstance(first, torch.Tensor):
                    record.input_bytes = _nbytes(first)

            def post(_m: nn.Module, _args: tuple[Any, ...], _out: Any, record: BlockActivations = record) -> None:
                record.forget_unread_last_matmul()
                self.current = None

            handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def probe_activations(model: nn.Module, *, micro_batch: int, seq_len: int, dtype: torch.dtype,
                      blocks_attr: str = "layers") -> ActivationProbe:
    """Run one forward of the (whole, unparallelized) meta ``model`` on ``[micro_batch, seq_len]`` tokens
    with its floating-point weights in ``dtype`` (the run's compute dtype, as autocast gives the
    matmuls). The weights are cast back afterwards (on meta, casts cost nothing).

    Blocks of the same structure (module types and parameter shapes) keep the same activations:
    the forward runs one block of each kind (the model's forward walks its ``blocks_attr``
    ModuleDict, which holds only those during the probe) and the others get its figures.
    """
    blocks = model.get_submodule(blocks_attr)
    kinds: dict[tuple[object, ...], list[str]] = {}
    for name, block in blocks.named_children():
        kinds.setdefault(block_structure(block), []).append(name)
    leaders = [names[0] for names in kinds.values()]
    recorder = _Recorder(model, leaders, blocks_attr, seq_len)
    tokens = torch.zeros((micro_batch, seq_len), dtype=torch.long, device="meta")
    with _weights_in(model, dtype), _only_blocks(blocks, leaders), recorder.hooks(model):
        recorder.param_storages = {_storage_key(p) for p in model.parameters()}
        recorder.name_weights(blocks)
        with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t), _OpOutputs(recorder):
            logits = model(tokens)
    # What the forward recorded (a MoE block's aux_loss, a tensor of this forward's graph) stays out of the model
    # the plan goes on with: pipelining deep-copies the stages, and torch refuses to copy a non-leaf tensor
    # (deepseek_v3 debugmoe with pp=2 was refused as a failure of the core's own code).
    discard_forward_records(model)
    per_block = {name: recorder.blocks[names[0]] for names in kinds.values() for name in names}
    ordered = {name: per_block[name] for name, _ in blocks.named_children()}
    return ActivationProbe(ordered, recorder.outside, _nbytes(logits))


@contextlib.contextmanager
def _only_blocks(blocks: nn.Module, names: list[str]) -> Iterator[None]:
    every = blocks._modules
    blocks._modules = {name: every[name] for name in every if name in set(names)}
    try:
        yield
    finally:
        blocks._modules = every


@contextlib.contextmanager
def _weights_in(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    originals = [(p, p.data) for p in model.parameters() if p.is_floating_point() and p.dtype != dtype]
    for p, data in originals:
        p.data = data.to(dtype)
    try:
        yield
    finally:
        for p, data in originals:
            p.data = data
