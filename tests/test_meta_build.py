"""Building a model on meta: no values computed, the same structure as a real build, and no torch._dynamo.

Every rank of every run builds its model on meta first. Random fills and the rotary tables computed there
produce nothing a run uses (``init_model_weights`` draws and ``init_buffers`` computes on the real device),
and on meta torch runs them through Python reference kernels whose first use imports torch._dynamo, about
1 s of CPU per process. These tests hold the meta build to the structure of a real one and keep that import
out of it.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from torch import nn

from titan_core.boundary.meta_model import meta_model
from titan_core.plugin.discovery import load_train_spec

FLAVORS = [("llama3", "debugmodel"), ("qwen3", "debugmodel"), ("qwen3", "debugmoe"), ("deepseek_v3", "debugmodel")]


def _args(spec_name: str, flavor: str) -> object:
    return dataclasses.replace(load_train_spec(spec_name).flavors[flavor], vocab_size=256)


@pytest.mark.fast
@pytest.mark.parametrize(("spec_name", "flavor"), FLAVORS, ids=[f"{s}-{f}" for s, f in FLAVORS])
def test_meta_build_has_every_parameter_and_buffer_of_a_real_build(spec_name: str, flavor: str) -> None:
    spec, args = load_train_spec(spec_name), _args(spec_name, flavor)
    meta = meta_model(spec, args)
    real = spec.model_cls(args)

    def shapes(model: nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        return {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}

    assert shapes(meta) == shapes(real)
    assert all(t.is_meta for t in [*meta.parameters(), *meta.buffers()])
    # The rotary table a meta build skips is what init_buffers() computes after to_empty.
    meta.to_empty(device="cpu")
    meta.init_buffers()  # type: ignore[operator]
    for (name, got), (_, want) in zip(meta.named_buffers(), real.named_buffers(), strict=True):
        assert torch.equal(got, want), name


@pytest.mark.fast
def test_meta_builds_import_no_torch_dynamo() -> None:
    code = ("import dataclasses, sys\n"
            "from titan_core.boundary.meta_model import meta_model\n"
            "from titan_core.plugin.discovery import load_train_spec\n"
            f"for name, flavor in {FLAVORS!r}:\n"
            "    spec = load_train_spec(name)\n"
            "    meta_model(spec, dataclasses.replace(spec.flavors[flavor], vocab_size=256))\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "a meta build imported torch._dynamo"


@pytest.mark.fast
def test_random_fills_of_real_tensors_still_run_inside_a_meta_build() -> None:
    """Only meta tensors are skipped: a constructor that fills a CPU tensor on purpose still gets its values."""

    class Odd(nn.Module):
        def __init__(self, _: object) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(4, 4))
            nn.init.normal_(self.weight)
            self.table = torch.zeros(3, device="cpu").uniform_(1.0, 2.0)

    class Spec:
        name = "odd"
        model_cls = Odd

    model = meta_model(Spec(), None)  # type: ignore[arg-type]
    assert model.weight.is_meta
    assert model.table.device.type == "cpu" and bool(((model.table >= 1.0) & (model.table < 2.0)).all())
