"""Activation checkpointing of a model's blocks that keeps every parameter name unchanged.

``checkpoint_wrapper`` nests each block under ``_checkpoint_wrapped_module``, which
changes ``named_parameters()`` (and with it the per-parameter init seeds and the
optimizer-state keys). Instead, the block's own ``forward`` is replaced by one that
runs the original under non-reentrant ``torch.utils.checkpoint``: the module tree,
and so every fully qualified name, stays as it was.

Modes (``ActivationCheckpointSection``):
  * ``full``: every block recomputes all of its activations in backward;
  * ``selective`` with ``selective_every = N``: every Nth block (by its global layer
    id, so the choice does not depend on the pipeline split) is fully checkpointed;
  * ``selective`` with ``selective_every = 0``: per-op; the outputs of the listed
    ops are kept and everything else is recomputed. The list is the config's
    ``selective_save_ops`` when set, else the one the spec supplies (its ops depend
    on the model's kernels). Matmuls (``aten.mm.default``) are special: only every
    other one is kept, halving their memory at the cost of recomputing the others,
    and once a forward has shown that nothing after a block's last one saves a tensor
    (a residual sum ends the block), that one is not kept either (:class:`_LastMatmul`).
    With the spec's list, the accelerator kernels that are the dearest to recompute
    (:data:`KERNEL_SAVE_OPS`: cuDNN, memory-efficient and flash attention, float8's
    ``_scaled_mm``, grouped GEMM, FlexAttention) are kept too, those this torch has; a
    list in the config is used exactly as written.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..config.sections import ActivationCheckpointSection
from ..errors import ConfigError
from .context_parallel import recompute_redirect

if TYPE_CHECKING:
    from torch.utils.checkpoint import SelectiveCheckpointContext


def resolve_ops(names: Sequence[str]) -> list[Any]:
    """Turn names like ``aten.mm.default`` into op overloads; unknown names are ConfigErrors."""
    ops = []
    for name in names:
        parts = name.split(".")
        op: Any = None
        if len(parts) == 3:
            try:
                op = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
            except (AttributeError, RuntimeError):
                op = None
        if op is None:
            raise ConfigError(
                f'activation_checkpoint.selective_save_ops: "{name}" is not an operator overload '
                f'of this torch build. Write names as "<namespace>.<op>.<overload>", e.g. "aten.mm.default".'
            )
        ops.append(op)
    return ops


KERNEL_SAVE_OPS: tuple[str, ...] = (
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_mm.default",
    "aten._grouped_mm.default",
    "higher_order.flex_attention",  # a higher-order op: no overload
)


def kernel_save_ops() -> list[Any]:
    """The ops of :data:`KERNEL_SAVE_OPS` this torch build has."""
    ops = []
    for name in KERNEL_SAVE_OPS:
        op: Any = torch.ops
        try:
            for part in name.split("."):
                op = getattr(op, part)
        except (AttributeError, RuntimeError):
            continue
        ops.append(op)
    return ops


def require_save_op_names(ac: ActivationCheckpointSection, spec_save_ops: Sequence[str]) -> None:
    """ConfigError for per-op selective checkpointing with no op to save (neither the config nor the spec names
    one); the dry run asks this too, so it refuses what the run would."""
    names = ac.selective_save_ops if ac.selective_save_ops is not None else list(spec_save_ops)
    if not names:
        raise ConfigError(
            "activation_checkpoint.mode=selective with selective_every=0 (per-op) needs a list of ops to "
            "save, and this spec supplies none. Set activation_checkpoint.selective_save_ops "
            '(e.g. ["aten.mm.default"]), or checkpoint every Nth block with selective_every=N.'
        )


def selective_save_ops(ac: ActivationCheckpointSection, spec_save_ops: Sequence[str]) -> list[Any]:
    """The ops per-op selective checkpointing keeps: the config's list as written, else the spec's
    with the accelerator kernels added."""
    if ac.selective_save_ops is not None:
        return resolve_ops(ac.selective_save_ops)
    ops = resolve_ops(spec_save_ops)
    return ops + [op for op in kernel_save_ops() if op not in ops]


class _LastMatmul:
    """What one block structure's forwards showed of its last matmul; shared by those blocks' forwards.

    A pre-norm block ends in a residual sum, which saves nothing for backward: the recompute stops
    (torch's early stop) once every tensor the backward reads is back, which is before the block's
    last matmul runs. Keeping that matmul's output would hold it from the forward to the block's
    backward for nothing (Llama's ``w2``: 16 MiB a block at batch 8 x 2048, width 256; under tensor
    parallelism a whole partial sum). So once a forward has shown the block's matmul count, and that
    nothing after its last matmul saves a tensor (only sums, views, casts and collectives follow), the
    next forwards do not keep that output. Blocks of one structure share what was learned
    (:func:`apply_activation_checkpointing`): in the first step only the first of them keeps it. A
    block with anything else after its last matmul (a post-norm block's norm reads it) keeps it as
    before.
    """

    def __init__(self) -> None:
        self.forward_count = 0  # matmuls of the latest forward (complete once it has returned)
        self.saves_after = True  # whether an op after the latest forward's last matmul may save a tensor

    def index_to_skip(self) -> int:
        """The 1-based index of the matmul whose output goes unkept in the next forward (0: none)."""
        return 0 if self.saves_after else self.forward_count

    def saw(self, op: Any) -> None:
        """Notes a forward op after the block's latest matmul."""
        if not self.saves_after and not saves_nothing(op):
            self.saves_after = True


# Their backward needs only sizes or dtypes: a residual sum, casts and copies, and the shuffles of
# a sequence-parallel reduce-scatter along a non-leading dimension (chunk, then cat).
_SAVE_NOTHING = frozenset(("aten.add.Tensor", "aten.add_.Tensor", "aten.sub.Tensor", "aten._to_copy.default",
                           "aten.clone.default", "aten.copy_.default", "aten._unsafe_view.default", "aten.cat.default",
                           "aten.stack.default", "aten.split.Tensor", "aten.split_with_sizes.default",
                           "aten.chunk.default", "aten.unbind.int"))


def saves_nothing(op: Any) -> bool:
    """Ops whose backward reads none of their inputs or outputs: sums, views, casts and collectives."""
    name = str(op)
    return (name in _SAVE_NOTHING or bool(getattr(op, "is_view", False))
            or name.startswith(("_c10d_functional.", "c10d_functional.")))


def selective_context_fn(save_ops: Sequence[Any]) -> Callable[[], Any]:
    """A ``context_fn`` for ``checkpoint()`` that saves the outputs of ``save_ops`` (every other mm,
    not the block's last one when nothing after it saves a tensor: see :class:`_LastMatmul`). Share
    one among blocks of one structure only: the last matmul is learned per ``context_fn``."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = set(save_ops)
    mm = torch.ops.aten.mm.default
    last_matmul = _LastMatmul()

    def make_contexts() -> Any:
        # One counter per forward and per recompute (torch versions that ask the policy again while
        # recomputing): both must make the same choice for the n-th matmul, so they count separately
        # and share one index to skip.
        counts: dict[str, int] = defaultdict(int)
        skipped = last_matmul.index_to_skip() if mm in save else 0

        def policy(ctx: SelectiveCheckpointContext, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
            if op is mm and mm in save:
                key = "recompute" if ctx.is_recompute else "forward"
                counts[key] += 1
                if not ctx.is_recompute:
                    last_matmul.forward_count, last_matmul.saves_after = counts[key], False
                keep = counts[key] % 2 == 1 and counts[key] != skipped
                return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
            if not ctx.is_recompute:
                last_matmul.saw(op)
            return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return make_contexts


def checkpoint_module(module: nn.Module, context_fn: Callable[[], Any] | None = None) -> None:
    """Make ``module``'s forward recompute in backward, without changing the module tree."""
    from torch.utils.checkpoint import checkpoint

    inner = module.forward
    kwargs: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": True,
                              "context_fn": functools.partial(_contexts_with_redirects, context_fn)}

    @functools.wraps(inner)
    def forward(*args: Any, **fw_kwargs: Any) -> Any:
        return checkpoint(inner, *args, **kwargs, **fw_kwargs)

    # An instance attribute shadows the class's forward; nn.Module.__call__ (and the
    # hooks FSDP2 adds later) still run around it.
    module.forward = forward
    module._titan_checkpointed = True  # type: ignore[assignment]  # read by layout reports and tests


def block_structure(block: nn.Module) -> tuple[object, ...]:
    """What makes two blocks run the same ops: their module types and parameters' names, shapes and dtypes."""
    return (tuple(type(m).__name__ for m in block.modules()),
            tuple((n, tuple(p.shape), p.dtype) for n, p in block.named_parameters()))


def _contexts_with_redirects(context_fn: Callable[[], Any] | None) -> tuple[Any, Any]:
    """(forward context, recompute context): ``context_fn``'s, with the recompute also under the attention
    redirect active at forward time (context parallelism). The recompute runs inside autograd's backward, where
    torch function modes entered around the forward are not active: without this, a recomputed block would
    attend within this rank's chunks only."""
    forward_ctx, recompute_ctx = context_fn() if context_fn is not None else (contextlib.nullcontext(),
                                                                            contextlib.nullcontext())
    redirect = recompute_redirect()
    if redirect is None:
        return forward_ctx, recompute_ctx
    return forward_ctx, _both(recompute_ctx, redirect)


@contextlib.contextmanager
def _both(first: contextlib.AbstractContextManager[Any], second: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    with first, second:
        yield


def apply_activation_checkpointing(
    blocks: Mapping[str, nn.Module], ac: ActivationCheckpointSection, *, spec_save_ops: Sequence[str] = ()
) -> list[str]:
    """Checkpoint the blocks (keyed by global layer id, "0", "1", ...) per ``ac``; returns those checkpointed.

    ``spec_save_ops`` is the spec's per-op list, used when ``ac.selective_save_ops`` is None.
    """
    if ac.mode == "none":
        return []
    save_ops: list[Any] | None = None
    every = 1
    if ac.mode == "selective":
        if ac.selective_every > 0:
            every = ac.selective_every
        else:
            require_save_op_names(ac, spec_save_ops)
            save_ops = selective_save_ops(ac, spec_save_ops)
    done = []
    # One context_fn per block structure: identical blocks learn their last matmul together (and compiled
    # identical blocks keep sharing one compilation); a dense and an MoE block learn theirs apart.
    per_structure: dict[tuple[object, ...], Callable[[], Any]] = {}
    for position, (name, block) in enumerate(blocks.items()):
        # Global layer ids: the same blocks are checkpointed whatever the pipeline split.
        index = int(name) if name.isdigit() else position
        if (index + 1) % every == 0:
            context_fn = None
            if save_ops is not None:
                context_fn = per_structure.setdefault(block_structure(block), selective_context_fn(save_ops))
            checkpoint_module(block, context_fn)
            done.append(name)
    return done
