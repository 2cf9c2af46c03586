"""The facts a run derives from its validated config, each derived here and nowhere else.

``resolve_config`` calls these once and keeps the results on ``ResolvedConfig``; the
Trainer, ``--dry-run``, the launcher's preflight and the conformance checks read them
from there. (The parallel degrees are derived in ``JobConfig``'s validator, which is
also where they are checked against the world size.)
"""

from __future__ import annotations

import torch

from ..boundary.plugin_boundary import SpecCalls
from ..config.job import JobConfig
from ..errors import ConfigError
from ..parallel.distributed import pick_device, resolve_backend
from ..plugin.protocols import Tokenizer
from ..plugin.resolved import MixedPrecision, promised_parallelism, resolve_mixed_precision
from ..runtime.launch_env import rank_env
from ..weights.shape import resolve_starting_weights
from ..weights.source import StartingWeights
from .tokenizer import build_tokenizer


def run_device_and_backend(config: JobConfig) -> tuple[torch.device, str]:
    """This process's device (by its local rank; 0 outside a launcher) and the resolved backend."""
    _, local_rank, _ = rank_env()
    device = pick_device(config.training.device, local_rank)
    return device, resolve_backend(config.parallelism.backend, device)


def run_precision(config: JobConfig, device: torch.device) -> MixedPrecision:
    """``training.dtype``, ``parallelism.param_dtype`` and ``reduce_dtype`` resolved for ``device``: what
    plugins receive as ``precision`` (plugin API 1.1) instead of the config's strings."""
    t, p = config.training, config.parallelism
    return resolve_mixed_precision(dtype=t.dtype, param_dtype=p.param_dtype, reduce_dtype=p.reduce_dtype,
                                   device=device)


def run_tokenizer(calls: SpecCalls, config: JobConfig) -> Tokenizer:
    """The spec's tokenizer, or the core's for ``data.tokenizer``."""
    tokenizer = calls.tokenizer(config.data)
    return build_tokenizer(config.data.tokenizer) if tokenizer is None else tokenizer


def check_seq_len(config: JobConfig, weights: StartingWeights, spec_name: str) -> None:
    """training.seq_len within the model's ``max_seq_len`` (when its args declare one), so that
    the config is refused before anything runs rather than at the first forward."""

    limit = getattr(weights.model_args, "max_seq_len", None)
    if isinstance(limit, int) and config.training.seq_len > limit:
        raise ConfigError(
            f"training.seq_len={config.training.seq_len} is longer than the model's max_seq_len={limit} "
            f"(spec {spec_name}, {weights.shape_source()}). Lower --training.seq_len, or raise the model's "
            f"limit (e.g. --{spec_name}.max_seq_len={config.training.seq_len}) where the spec allows it."
        )


def check_vocab(args: object, tokenizer: Tokenizer, spec_name: str) -> None:
    """The model's embedding (when its args declare ``vocab_size``) holds every token id the tokenizer
    gives; otherwise the first forward fails with an IndexError deep in the embedding."""
    model_vocab = getattr(args, "vocab_size", None)
    if isinstance(model_vocab, int) and tokenizer.vocab_size > model_vocab:
        raise ConfigError(
            f"the tokenizer gives {tokenizer.vocab_size} token ids but the model's vocab_size is {model_vocab} "
            f"(spec {spec_name}), so ids from {model_vocab} up have no embedding. Use the tokenizer the model "
            f"was made for (--data.tokenizer), or raise the model's vocab_size to {tokenizer.vocab_size} or more "
            f"(e.g. --{spec_name}.vocab_size={tokenizer.vocab_size} where the spec allows it)."
        )


def run_weights(calls: SpecCalls, config: JobConfig, *, tokenizer: Tokenizer, world_size: int) -> StartingWeights:
    """The starting weights and the model args: the flavor's with the spec section and the tokenizer's
    vocabulary applied, or the shape of a ``checkpoint.initial_load``'s config.json; the args checked
    against the sequence length, pipelining support and the spec's own layout rules (``validate_fn``),
    so every path that builds the model sees the same args and the same refusals.
    """

    spec = calls.spec
    weights = resolve_starting_weights(spec, config, tokenizer=tokenizer)
    args = weights.model_args
    check_seq_len(config, weights, spec.name)
    check_vocab(args, tokenizer, spec.name)
    pp = config.parallelism.pp
    if pp > 1 and spec.pipelining_fn is None:
        raise ConfigError(f'spec "{spec.name}" has no pipelining_fn, so it cannot be split into pipeline stages, '
                          f"but parallelism.pp={pp}. Set parallelism.pp=1 (and use dp_shard / tp instead).")
    device, _ = run_device_and_backend(config)
    precision = run_precision(config, device)
    calls.validate(args, parallelism=promised_parallelism(config.parallelism, precision), training=config.training,
                   world_size=world_size, added={"precision": precision, "device": device})
    return weights
