"""Context parallelism in a run: each rank's share of every sequence, and attention redirected across ranks.

The trainer hands every batch (read whole by each cp rank of a data-parallel rank) to
:meth:`ContextParallel.shard_batch`, which keeps this rank's chunks of the tokens, labels and
positions. Positions are always passed to the model under cp: they are the tokens' places in
the whole sequence (or in their document, with document masking), which rotary embeddings need
once a rank's tokens are no longer ``0 .. local - 1``.

The model is not changed: while :meth:`ContextParallel.attention` is active, every call of
``torch.nn.functional.scaled_dot_product_attention`` is replaced by
:func:`context_attention.context_parallel_attention` (a ``TorchFunctionMode``, the way torch's
own context parallelism reaches SDPA). A model declares it can run so by defining
``use_context_parallel_attention()``: called once on the meta model, it routes all of its
attention through SDPA, causal (``is_causal=True``) or block-causal by ``positions`` (a
boolean ``attn_mask``). The mask the model builds from its local positions is then replaced
by the one the core computes from the global layout, which knows where each chunk sits.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError
from .context_attention import AttentionWork, context_parallel_attention
from .context_layout import ContextLayout

MODEL_HOOK = "use_context_parallel_attention"


def supports_context_parallel(model_cls: type) -> bool:
    """Whether the model class declares it can run under context parallelism (``docs/plugins.md``)."""
    return callable(getattr(model_cls, MODEL_HOOK, None))


def require_support(model_cls: type, *, spec_name: str, cp: int) -> None:
    """ConfigError when the model class does not declare context-parallelism support."""
    if not supports_context_parallel(model_cls):
        raise ConfigError(
            f"parallelism.cp={cp}: the model of spec {spec_name} ({model_cls.__name__}) does not declare "
            f"context-parallelism support (a {MODEL_HOOK}() method that routes its attention through "
            f"torch.nn.functional.scaled_dot_product_attention). Set parallelism.cp=1, or add the method "
            f"(docs/plugins.md, \"Context parallelism\")"
        )


def prepare_model(model: nn.Module, *, spec_name: str, cp: int) -> None:
    """Ask the (meta) model to route its attention through SDPA; ConfigError when it cannot."""
    require_support(type(model), spec_name=spec_name, cp=cp)
    getattr(model, MODEL_HOOK)()


def check_sharded_over_cp(model_parts: list[nn.Module], group: dist.ProcessGroup, *, spec_name: str) -> None:
    """Every parameter's gradient must be reduced over the cp ranks (they see different tokens): each must be a
    DTensor whose mesh spans this rank's cp group, as ``parallel_dims.dp_mesh(mesh)`` gives. A parallelize_fn
    that shards over another mesh would train each cp rank on its own tokens only, silently."""
    cp_ranks = set(dist.get_process_group_ranks(group))
    for part in model_parts:
        for name, param in part.named_parameters():
            mesh = getattr(param, "device_mesh", None)
            ranks = set(mesh.mesh.flatten().tolist()) if mesh is not None else set()
            if not cp_ranks <= ranks:
                raise ConfigError(
                    f"parallelism.cp: parameter {name} of spec {spec_name} is not sharded or replicated over the "
                    f"context-parallel ranks {sorted(cp_ranks)}, so its gradient would miss their tokens. The "
                    f"spec's parallelize_fn must apply FSDP2 over parallel_dims.dp_mesh(mesh) (which folds cp in), "
                    f"as titan_core.default_parallelize_fn does"
                )


class ContextParallel:
    """This rank's place among the cp ranks of its data-parallel rank, for sequences of ``seq_len``."""

    def __init__(self, *, group: dist.ProcessGroup, seq_len: int, load_balance: bool, document_masking: bool) -> None:
        self.group = group
        self.layout = ContextLayout(dist.get_world_size(group), dist.get_rank(group), seq_len, load_balance)
        self.document_masking = document_masking
        self.work: AttentionWork | None = None  # set by the balance benchmark to count attention pairs
        self.redirected = 0  # SDPA calls redirected so far (a model that made none is refused)
        # The cross-rank attention as the redirect calls it (made by the first attention(), see there).
        self.eager_sdpa: Any = None

    def shard_batch(self, inputs: torch.Tensor, labels: torch.Tensor,
                    positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's chunks of a batch of whole sequences, with positions always given."""
        if positions is None:  # one document per row: the place in the sequence
            positions = torch.arange(inputs.shape[1]).expand(inputs.shape[0], -1)
        shard = self.layout.shard
        return shard(inputs), shard(labels), shard(positions)

    def query_starts(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Each local token's document start in the whole sequence (None without document masking)."""
        if not self.document_masking:
            return None
        return self.layout.global_index(positions.device) - positions.long()

    @contextlib.contextmanager
    def attention(self, positions: torch.Tensor) -> Iterator[None]:
        """Around a forward (and a backward that may recompute it): SDPA computed across the cp ranks."""
        starts = self.query_starts(positions)
        if self.eager_sdpa is None:
            # With compiled blocks, left out of their graphs (its exchanges between ranks run eagerly: the graph
            # breaks there). Made here, outside any compiled code (built inside, it would cost a recompile), and
            # only when something was compiled (torch.compile imported the compiler): importing it takes a second.
            compiling = "torch._dynamo" in sys.modules
            self.eager_sdpa = torch.compiler.disable(_sdpa_across_ranks) if compiling else _sdpa_across_ranks
        active = _active_redirects()
        redirect = _RedirectAttention(self, starts)
        active.append(redirect)
        try:
            with redirect:
                yield
        finally:
            active.pop()

    def follow_micro_batches(self, stages: list[nn.Module]) -> None:
        """Pipeline stages: the schedule runs the step's micro-batches one at a time, each with its own rows'
        ``positions`` keyword; each stage's forward points the active redirect at those rows' documents
        (document masking; a recompute takes the ones of its own forward)."""
        if not self.document_masking:
            return

        def to_this_micro_batch(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            active, positions = _active_redirects(), kwargs.get("positions")
            if active and positions is not None:
                active[-1].starts = self.query_starts(positions)

        for stage in stages:
            stage.register_forward_pre_hook(to_this_micro_batch, with_kwargs=True)

    def check_redirected(self, *, spec_name: str) -> None:
        """After the first forward: a model whose attention never reached SDPA attended within its chunks only."""
        if not self.redirected:
            raise ConfigError(
                f"parallelism.cp={self.layout.cp}: the model of spec {spec_name} ran a forward without calling "
                f"torch.nn.functional.scaled_dot_product_attention, so its attention saw only this rank's chunks. "
                f"Its {MODEL_HOOK}() must route attention through SDPA; or set parallelism.cp=1"
            )

    def sdpa(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
             *, starts: torch.Tensor | None) -> torch.Tensor:
        """SDPA's signature; the result over the whole sequence."""
        if dropout_p:
            raise ConfigError(f"parallelism.cp: attention dropout ({dropout_p}) is not supported under context "
                              f"parallelism; set parallelism.cp=1 or the model's attention dropout to 0")
        if attn_mask is None and not is_causal:
            raise ConfigError("parallelism.cp: the model called scaled_dot_product_attention without is_causal or a "
                              "mask (bidirectional attention); context parallelism serves causal decoders only")
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            raise ConfigError(f"parallelism.cp: the model passed a {attn_mask.dtype} attn_mask (an additive bias); "
                              f"context parallelism replaces only causal or block-causal boolean masks")
        self.redirected += 1
        return context_parallel_attention(query, key, value, layout=self.layout, starts=starts, scale=scale,
                                          group=self.group, work=self.work)


_THREAD = threading.local()


def _active_redirects() -> list[_RedirectAttention]:
    if not hasattr(_THREAD, "redirects"):
        _THREAD.redirects = []
    redirects: list[_RedirectAttention] = _THREAD.redirects
    return redirects


def recompute_redirect() -> contextlib.AbstractContextManager[Any] | None:
    """A fresh redirect like the one active now, for activation checkpointing to recompute a block under
    (``checkpointing.checkpoint_module``); None outside context parallelism."""
    active = _active_redirects()
    if not active:
        return None
    return _RedirectAttention(active[-1].cp, active[-1].starts)  # the rows of the forward being checkpointed


class _RedirectAttention(TorchFunctionMode):
    """Sends ``F.scaled_dot_product_attention`` to the context-parallel kernel; every other call runs as it is."""

    def __init__(self, cp: ContextParallel, starts: torch.Tensor | None) -> None:
        super().__init__()
        self.cp, self.starts = cp, starts

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self.cp.eager_sdpa(self.cp, self.starts, *args, **kwargs)
        name = getattr(func, "__name__", "")
        if args and isinstance(args[0], torch.Tensor) and getattr(torch.Tensor, name, None) is func:
            # A tensor method called as one: torch.compile traces ``x.unflatten(...)`` as the tensor op, while
            # ``Tensor.unflatten(x, ...)`` would make it inline the Python method, whose ``super()`` it cannot.
            return getattr(args[0], name)(*args[1:], **kwargs)
        return func(*args, **kwargs)


def _sdpa_across_ranks(cp: ContextParallel, starts: torch.Tensor | None, *args: Any, **kwargs: Any) -> torch.Tensor:
    return cp.sdpa(*args, **kwargs, starts=starts)

