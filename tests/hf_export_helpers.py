"""The export half of the adapter tests: a titan model shaped like a transformers folder, moved away from its
initial values, written back as a Hugging Face folder by the spec's adapter (any spec: qwen3, deepseek_v3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from titan_core.hf.stacks import unstack


def perturbed_model_shaped_like(adapter: Any, model_class: Callable[[Any], torch.nn.Module],
                                hf_folder: Path) -> tuple[Any, torch.nn.Module]:
    """(args, model): the model args ``adapter`` reads from ``hf_folder``'s config.json, and a model of them
    initialised with seed 3 then perturbed, so that norms are away from 1 and a wrong map shows."""
    args = adapter.model_args_from_hf(json.loads((hf_folder / "config.json").read_text()))
    model = model_class(args)
    model.init_weights(seed=3)  # type: ignore[operator]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return args, model


def save_as_hf_folder(adapter: Any, model: torch.nn.Module, args: Any, out: Path) -> dict[str, torch.Tensor]:
    """Write ``model`` to ``out`` (model.safetensors, one tensor per expert, and config.json); return the tensors."""
    out.mkdir()
    tensors = unstack(adapter, adapter.to_hf(model.state_dict(), args))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(adapter.hf_config(args)))
    return tensors


def assert_convert_round_trips(source: Path, spec: str, work: Path, reference: Callable[[Path], Any],
                               tokens: torch.Tensor) -> None:
    """titan-convert from-hf then to-hf (its main, in this process) gives back ``source``'s tensors bit for bit,
    and transformers (``reference`` loads a folder) computes the same logits on both folders."""
    from safetensors.torch import load_file

    from titan_core.commands.convert import main as convert_main

    assert convert_main(["from-hf", "--spec", spec, str(source), str(work / "ckpt")]) == 0
    assert convert_main(["to-hf", str(work / "ckpt" / "step-000000"), str(work / "back")]) == 0
    original, again = load_file(source / "model.safetensors"), load_file(work / "back" / "model.safetensors")
    assert sorted(again) == sorted(original)
    assert all(torch.equal(again[k], original[k]) for k in original)
    with torch.no_grad():
        assert torch.equal(reference(source)(tokens).logits, reference(work / "back")(tokens).logits)
