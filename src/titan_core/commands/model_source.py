"""What titan-generate and titan-eval share: the model they load (a titan checkpoint, a run folder's
newest checkpoint or a Hugging Face folder) and the device they run it on, from the same flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..runtime.folder_kinds import is_hf_folder, is_titan_checkpoint
from ..train.whole_model import WholeModel, load_hf_folder, load_titan_checkpoint
from ..weights.titan_checkpoint import newest_checkpoint

if TYPE_CHECKING:
    import torch

__all__ = ["LoadedSource", "add_model_source_arguments", "load_model", "load_model_source", "resolve_source",
           "usable_device"]


def add_model_source_arguments(p: argparse.ArgumentParser) -> None:
    """SOURCE, --config, --spec, --device and --traceback."""
    p.add_argument("source", type=Path, help="a titan checkpoint (step-N folder), a run folder (its newest "
                                             "checkpoint) or a Hugging Face folder")
    p.add_argument("--config", type=Path, default=None,
                   help="a titan checkpoint's run config.toml (default: <checkpoint>/../../config.toml when present)")
    p.add_argument("--spec", default=None, help="a Hugging Face folder: the TrainSpec whose adapter reads it "
                                                "(default: the only installed spec)")
    p.add_argument("--device", default="cpu", help="torch device to run on (default cpu)")
    p.add_argument("--traceback", action="store_true", help="show Python tracebacks for errors")


@dataclass(frozen=True)
class LoadedSource:
    """SOURCE loaded: the model with its tokenizer and spec, its module on ``device``, what kind of folder
    it came from ("titan" or "hf") and which folder (a run folder's newest checkpoint, say)."""

    whole: WholeModel
    model: torch.nn.Module
    device: torch.device
    kind: str
    folder: Path

    def describe(self) -> str:
        """``FOLDER (titan checkpoint, spec NAME)``, for the tool's first line."""
        what = "titan checkpoint" if self.kind == "titan" else "Hugging Face folder"
        return f"{self.folder} ({what}, spec {self.whole.spec.name})"


def load_model_source(args: argparse.Namespace, *, prog: str) -> LoadedSource:
    """SOURCE's model on ``--device``, every flag checked before the load."""
    return load_model(args.source, config=args.config, spec=args.spec, device_name=args.device, prog=prog)


def load_model(source: Path, *, config: Path | None, spec: str | None, device_name: str, prog: str) -> LoadedSource:
    """``source`` (a checkpoint, a run folder or a Hugging Face folder) loaded on ``device_name``, the
    device checked before the load; the same for every tool that reads a model (titan-eval, lm-eval's adapter)."""
    device = usable_device(device_name)
    kind, folder = resolve_source(source)
    whole = (load_titan_checkpoint(folder, config=config) if kind == "titan"
             else load_hf_folder(folder, spec_name=spec, what=prog))
    try:
        model = whole.model.to(device)
    except Exception as exc:  # noqa: BLE001 (torch's backends fail with AssertionError, RuntimeError, ...)
        raise ConfigError(f"--device {device_name} cannot be used: {type(exc).__name__}: {exc}.") from None
    return LoadedSource(whole, model, device, kind, folder)


def usable_device(name: str) -> torch.device:
    """``--device`` as a device this torch can compute on, checked before anything is loaded."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"--device {name!r} is not a torch device ({exc}); give cpu, cuda or cuda:N.") from None
    if device.type == "meta":
        raise ConfigError("--device meta holds shapes, not values: nothing can be computed on it; give cpu or cuda.")
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
