"""``titan-generate SOURCE --prompt TEXT``: a continuation of TEXT sampled from a trained model.

SOURCE is a titan checkpoint (a ``step-N`` folder, from any parallel layout: it is read
on one process), a run folder (its newest checkpoint), or a Hugging Face folder (e.g. a
run's ``export/hf``). Greedy by default; ``--temperature`` above 0 samples, optionally among
the ``--top-k`` most likely tokens, reproducibly for one ``--seed``. The prompt and its
continuation go to stdout, what was loaded and how to stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..models.sampling import Sampling, sample, takes_cache
from ..runtime.folder_kinds import is_hf_folder, is_titan_checkpoint
from ..train.whole_model import load_hf_folder, load_titan_checkpoint
from ..weights.titan_checkpoint import newest_checkpoint
from .tool_main import parse_and_run

if TYPE_CHECKING:
    import torch

PROG = "titan-generate"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Sample a continuation of a prompt from a titan checkpoint "
                                                      "or a Hugging Face folder (greedy by default).")
    p.add_argument("source", type=Path, help="a titan checkpoint (step-N folder), a run folder (its newest "
                                             "checkpoint) or a Hugging Face folder")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to add at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, the most likely token each time; above 0: sample, hotter is more random")
    p.add_argument("--top-k", type=int, default=None, help="with --temperature: sample among the k most likely tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument("--config", type=Path, default=None,
                   help="a titan checkpoint's run config.toml (default: <checkpoint>/../../config.toml when present)")
    p.add_argument("--spec", default=None, help="a Hugging Face folder: the TrainSpec whose adapter reads it "
                                                "(default: the only installed spec)")
    p.add_argument("--device", default="cpu", help="torch device to run on (default cpu)")
    p.add_argument("--traceback", action="store_true", help="show Python tracebacks for errors")
    return p


def check_settings(args: argparse.Namespace) -> None:
    """Every flag's value, before anything is loaded."""
    if args.max_new_tokens <= 0:
        raise ConfigError(f"--max-new-tokens must be a positive number of tokens, got {args.max_new_tokens}.")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ConfigError(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}.")
    if args.top_k is not None and args.top_k <= 0:
        raise ConfigError(f"--top-k must be a positive number of tokens, got {args.top_k}; leave it out to sample "
                          f"from every token.")
    if not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed must be a whole number from 0 to 2**63-1 (torch's generator takes no more), got "
                          f"{args.seed}.")
    if args.top_k is not None and args.temperature == 0:
        raise ConfigError("--top-k applies to sampling; add --temperature above 0 (e.g. 0.8), or leave --top-k out "
                          "for greedy output.")


def usable_device(name: str) -> torch.device:
    """``--device`` as a device this torch can compute on, checked before anything is loaded."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"--device {name!r} is not a torch device ({exc}); give cpu, cuda or cuda:N.") from None
    if device.type == "meta":
        raise ConfigError("--device meta holds shapes, not values: nothing can be generated on it; give cpu or cuda.")
    if device.type == "cuda" and not torch.cuda.is_available():  # torch itself would raise an AssertionError
        raise ConfigError(f"--device {name}: this torch sees no CUDA device (CUDA build: "
                          f"{torch.version.cuda or 'none'}). Use --device cpu.")
    try:
        torch.zeros(1, device=device) + 1  # the backend is compiled in, present and computes
    except Exception as exc:  # noqa: BLE001 (a torch without CUDA raises AssertionError)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--device {name} cannot be used by this torch ({first}); give --device cpu, or install a "
                          f"torch built for it.") from None
    return device


def resolve_source(path: Path) -> tuple[str, Path]:
    """("titan" | "hf", the folder to load) for SOURCE; ConfigError when it is none of the three kinds."""

    if not path.exists():
        raise ConfigError(f"{path} does not exist; give a titan checkpoint (runs/x/checkpoints/step-N), a run folder "
                          f"or a Hugging Face folder.")
    if is_titan_checkpoint(path):
        return "titan", path
    if is_hf_folder(path):
        return "hf", path
    found = newest_checkpoint(path)
    if found is not None:
        return "titan", found[0]
    if is_hf_folder(path / "export" / "hf"):
        return "hf", path / "export" / "hf"
    raise ConfigError(f"{path} is not a titan checkpoint (no titan_checkpoint.json), nor a run folder with "
                      f"checkpoints, nor a Hugging Face folder (config.json + model.safetensors); point it at one "
                      f"(a run saves checkpoints with --checkpoint.enable=true).")


def generate(args: argparse.Namespace) -> int:


    check_settings(args)
    device = usable_device(args.device)
    kind, folder = resolve_source(args.source)
    if kind == "titan":
        whole = load_titan_checkpoint(folder, config=args.config)
    else:
        whole = load_hf_folder(folder, spec_name=args.spec, what=PROG)
    try:
        model = whole.model.to(device)
    except Exception as exc:  # noqa: BLE001 (torch's backends fail with AssertionError, RuntimeError, ...)
        raise ConfigError(f"--device {args.device} cannot be used: {type(exc).__name__}: {exc}.") from None
    prompt = whole.tokenizer.encode(args.prompt, bos=True)
    new_tokens = args.max_new_tokens
    limit = getattr(whole.model_args, "max_seq_len", None)
    if isinstance(limit, int):
        if len(prompt) >= limit:
            raise ConfigError(f"the prompt is {len(prompt)} tokens but the model reads at most {limit} positions "
                              f"(its max_seq_len), leaving no room for a new token; shorten the prompt.")
        if len(prompt) + new_tokens > limit:
            new_tokens = limit - len(prompt)
            print(f"[{PROG}] only {new_tokens} new tokens fit in the model's {limit} positions (max_seq_len)",
                  file=sys.stderr)
    cached = takes_cache(model)
    how = "greedy" if args.temperature == 0 else (
        f"sampled at temperature {args.temperature}" + (f", top-k {args.top_k}" if args.top_k else "")
        + f", seed {args.seed}")
    speed = "with a KV cache" if cached else (
        "without a KV cache: the model's forward takes no cache argument, so every new token recomputes the "
        "whole prefix (slower; see docs/seeing-a-run.md)")
    print(f"[{PROG}] {folder} ({'titan checkpoint' if kind == 'titan' else 'Hugging Face folder'}, spec "
          f"{whole.spec.name}): up to {new_tokens} new tokens, {how}, {speed}", file=sys.stderr, flush=True)
    settings = Sampling(max_new_tokens=new_tokens, temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    new = sample(model, prompt, settings, eos_id=whole.tokenizer.eos_id, use_cache=cached)
    if new and new[-1] == whole.tokenizer.eos_id:
        new = new[:-1]  # the end-of-document token is not text
    print(args.prompt + whole.tokenizer.decode(new), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return parse_and_run(PROG, build_parser(), generate, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
