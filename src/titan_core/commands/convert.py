"""``titan-convert``: checkpoint formats, either way, on one process.

    titan-convert to-hf CHECKPOINT OUT     a titan checkpoint (any layout it was saved from) -> a Hugging Face folder
                                           (--weights ema: the checkpoint's EMA of the weights instead)
    titan-convert from-hf HF_DIR OUT       a Hugging Face folder -> a titan checkpoint (OUT/step-000000)

Both go through the spec's ``state_dict_adapter``; a folder of the wrong kind, an OUT
that already holds files, or a model that does not fit is one message and exit 2. OUT is
written beside its place (``.OUT.partial``) and renamed into it when complete
(``folder_publish``): an interrupted conversion leaves no OUT that looks complete, and the
same command run again starts over cleanly.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..checkpoint import RunIdentity, collect_param_shapes
from ..checkpoint.weights_only import write_weights_checkpoint
from ..config.finite import FLOAT32_MAX
from ..errors import ConfigError, TitanError
from ..hf.export import export_hf
from ..plugin import discovery
from ..runtime.folder_kinds import is_hf_folder, is_titan_checkpoint
from ..runtime.folder_publish import discard_partial, fresh_partial, partial_of, publish
from ..runtime.os_errors import describe_os_error
from ..runtime.path_settings import remember_tool_paths
from ..train.whole_model import cpu_model, load_titan_checkpoint
from ..weights.load import load_hf_weights
from ..weights.shape import hf_starting_weights
from ..weights.source import HF_CONFIG_IN_CHECKPOINT
from ..weights.titan_checkpoint import run_folder_hint
from .tool_main import run_tool


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="titan-convert", description="Convert checkpoints between titan and Hugging Face.")
    sub = p.add_subparsers(dest="command", required=True)
    to_hf = sub.add_parser("to-hf", help="a titan checkpoint folder (step-N) -> a Hugging Face folder")
    to_hf.add_argument("checkpoint", type=Path)
    to_hf.add_argument("out", type=Path)
    to_hf.add_argument("--config", type=Path, default=None,
                       help="the run's config.toml (default: <checkpoint>/../../config.toml when present)")
    to_hf.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    to_hf.add_argument("--shard-gb", type=float, default=5.0, help="start a new safetensors file above this size")
    to_hf.add_argument("--weights", choices=("raw", "ema"), default="raw",
                       help="raw: the trained weights; ema: the checkpoint's EMA of them (a run with [ema])")
    from_hf = sub.add_parser("from-hf", help="a Hugging Face folder -> a titan checkpoint (OUT/step-000000)")
    from_hf.add_argument("hf_dir", type=Path)
    from_hf.add_argument("out", type=Path)
    from_hf.add_argument("--spec", default=None,
                         help="the TrainSpec whose adapter reads the folder (default: the only installed spec)")
    for sp in (to_hf, from_hf):
        sp.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr: auto = for models of 64 MB or more")
        sp.add_argument("--traceback", action="store_true", help="show Python tracebacks for errors")
    return p


class ProgressBar:
    """``[titan-convert] reading: 12 tensors, 540.2 of 1,200.0 MB (45%)``, redrawn on one stderr line."""

    def __init__(self, label: str, total_bytes: int, *, mode: str) -> None:
        self.label, self.total, self.done, self.count = label, max(total_bytes, 1), 0, 0
        self.enabled = mode == "always" or (mode == "auto" and total_bytes >= 64 * 2**20)

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        self.count += 1
        if self.enabled:
            pct = 100 * self.done / self.total
            print(f"\r[titan-convert] {self.label}: {self.count} tensors, {self.done / 1e6:,.1f} of "
                  f"{self.total / 1e6:,.1f} MB ({pct:3.0f}%)", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr, flush=True)


def _require_new_folder(out: Path, source: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} already exists and is not an empty folder; choose a new OUT folder "
                          f"(titan-convert never overwrites files).")
    # Writing into the input would change what was read: a titan checkpoint holds exactly the
    # files its manifest lists, and an HF folder would gain a folder nobody asked for.
    if out.resolve().is_relative_to(source.resolve()):
        raise ConfigError(f"{out} is inside the input folder {source}; choose an OUT folder outside it "
                          f"(titan-convert never changes its input).")



def check_flags(args: argparse.Namespace) -> None:
    """The flags get titan-train's checks: sizes finite, positive and representable."""
    import math


    shard_gb = getattr(args, "shard_gb", None)
    if shard_gb is not None and not (math.isfinite(shard_gb) and 1e-9 <= shard_gb <= FLOAT32_MAX):
        raise ConfigError(f"--shard-gb {shard_gb!r}: give the largest safetensors file in GB, a finite number from "
                          f"1e-9 up (e.g. --shard-gb 5); checkpoint.export_shard_gb takes the same values.")


def to_hf(args: argparse.Namespace) -> int:
    import torch

    ckpt: Path = args.checkpoint
    if is_hf_folder(ckpt):
        raise ConfigError(f"{ckpt} is already a Hugging Face folder; to-hf reads a titan checkpoint "
                          f"(a step-N folder with titan_checkpoint.json). Did you mean from-hf?")
    if not is_titan_checkpoint(ckpt):
        hint = run_folder_hint(ckpt) or (" It holds step-N folders: name one of them."
                                         if any(ckpt.glob("step-*")) else "")
        raise ConfigError(f"{ckpt} is not a titan checkpoint (no titan_checkpoint.json); to-hf reads a step-N "
                          f"folder such as runs/x/checkpoints/step-000100.{hint}")
    _require_new_folder(args.out, ckpt)
    whole = load_titan_checkpoint(ckpt, config=args.config, weights=args.weights)
    spec, model, model_args, tokenizer = whole.spec, whole.model, whole.model_args, whole.tokenizer
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    bar = ProgressBar("writing", total, mode=args.progress)
    export_hf([model], args.out, spec=spec, model_args=model_args, tokenizer=tokenizer,
              dtype=getattr(torch, args.dtype), shard_gb=args.shard_gb, is_rank0=True, on_tensor=bar.advance,
              failure_advice=_nothing_written(args.out), weights=args.weights)
    bar.close()
    return 0


def from_hf(args: argparse.Namespace) -> int:
    if is_titan_checkpoint(args.hf_dir):
        raise ConfigError(f"{args.hf_dir} is a titan checkpoint; from-hf reads a Hugging Face folder "
                          f"(config.json + safetensors). Did you mean to-hf?")
    _require_new_folder(args.out, args.hf_dir)
    spec = discovery.load_train_spec(args.spec or discovery.default_spec_name())
    # The folder's shape, checked against its tensor headers before any weight is allocated.
    weights, folder = hf_starting_weights(spec, args.hf_dir, what="from-hf", purpose="from-hf")
    model_args = weights.model_args
    model, ties = cpu_model(spec, model_args)
    total = sum(_numel(info.shape) * info.dtype.itemsize for info in folder.tensors.values())
    bar = ProgressBar("reading", total, mode=args.progress)
    load_hf_weights(folder, spec=spec, model_parts=[model], model_args=model_args, ties=ties, on_tensor=bar.advance,
                    what="from-hf")
    bar.close()
    identity = RunIdentity(spec=spec.name, flavor="from-hf", converters=(),
                           param_shapes=collect_param_shapes([model]))
    # Written beside OUT and published whole at the end: an interrupted conversion never leaves an
    # OUT that looks complete, and a rerun starts it again. The shape travels with the weights (listed
    # in the checkpoint's manifest), so initial_load and to-hf need no flags.
    work = fresh_partial(args.out)
    step_dir = write_weights_checkpoint(work, [model], identity=identity, extra_files={
        HF_CONFIG_IN_CHECKPOINT: json.dumps(folder.config, indent=2).encode("utf-8")},
        failure_advice=f"{_nothing_written(args.out)} Free space on that filesystem, or give an OUT folder on another one.")
    publish(work, args.out)
    step_dir = args.out / step_dir.name
    print(f"[titan-convert] wrote the titan checkpoint {step_dir}; start a run from it with "
          f"--checkpoint.initial_load={step_dir}", flush=True)
    return 0


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    # like Ctrl+C: one line and 143; OUT appears only whole (written beside it, renamed)
    return run_tool("titan-convert", _convert, args)


def _nothing_written(out: Path) -> str:
    return f"Nothing was written to {out} (its unfinished copy {partial_of(out)} is removed)."


def _convert(args: argparse.Namespace) -> int:
    check_flags(args)
    # An OS error names OUT (the positional), never a titan-train setting; the copy beside OUT counts as OUT.
    remember_tool_paths([("OUT", args.out), ("OUT", partial_of(args.out))], unnamed="OUT")
    try:
        return to_hf(args) if args.command == "to-hf" else from_hf(args)
    except OSError as exc:  # publishing, a file beside the tensors: the OS error, and that OUT is not there
        discard_partial(args.out)
        raise TitanError(f"{describe_os_error(exc)} {_nothing_written(args.out)}") from exc
    except BaseException:  # a full disk in the checkpoint writer, a signal, a bug: no half copy beside OUT either
        discard_partial(args.out)
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
