"""The files of a new model package (``titan-plugin new spec NAME``); ``$name`` etc. are filled in."""

from pathlib import Path

from .pyproject_file import pyproject


def _template(module: str) -> str:
    """A module of this folder written for the spec "tiny", as a template: its names become ``${name}``/``${Cls}``."""
    text = (Path(__file__).parent / module).read_text(encoding="utf-8")
    return text.replace("Tiny", "${Cls}").replace("tiny", "${name}")


PYPROJECT = pyproject(kind="model", group="titan.train_specs", target="$pkg.spec:${name}_spec",
                      comment="titan-train --spec $name imports $pkg.spec\n# and reads its ${name}_spec attribute.")

INIT = '''"""$dist: a titan-core model plugin (entry point ``$name``)."""

from .model import ${Cls}Args, ${Cls}Model, flops_per_token
from .spec import ${Cls}Section, flavors, ${name}_spec

__all__ = ["${Cls}Args", "${Cls}Model", "${Cls}Section", "flavors", "flops_per_token", "${name}_spec"]
'''

# The model and its TP plan are real modules of this package (type-checked, and what the core's own
# ``tiny`` spec trains: testing/tiny_spec.py); a new package gets them with its names filled in.
MODEL = _template("tiny_model.py")

TP_PLAN = _template("tiny_tp_plan.py")

SPEC = '''"""The $name TrainSpec: what the ``titan.train_specs`` entry point ``$name`` names.

Only the model, its flavors and a TP plan: parallelism is titan-core's default
parallelize_fn (TP -> activation checkpointing -> compile -> FSDP2), and the loss,
tokenizer, data, optimizer, LR schedule and metrics are the core's defaults.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from titan_core import ConfigError, ParallelismSection, TrainingSection, TrainSpec

from .model import ${Cls}Args, ${Cls}Model, flops_per_token
from .tp_plan import ${name}_tp_plan


class ${Cls}Section(BaseModel):
    """The ``[$name]`` config section: a field left None keeps the flavor's value."""

    model_config = ConfigDict(extra="forbid")

    n_layers: int | None = Field(None, gt=0, description="Number of blocks (default: the flavor's).")


flavors: dict[str, ${Cls}Args] = {
    "debugmodel": ${Cls}Args(dim=64, n_layers=2, n_heads=4, hidden=256),
    "small": ${Cls}Args(dim=768, n_layers=12, n_heads=12, hidden=3072),
}


def validate_${name}(args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int) -> None:
    """Refuse layouts the model cannot take, before any process starts."""
    del training, world_size
    for what, value in (("n_heads", args.n_heads), ("hidden", args.hidden)):
        if value % parallelism.tp:
            raise ConfigError(f"parallelism.tp={parallelism.tp} does not divide $name {what}={value}; "
                              f"choose a tp degree that divides it.")


${name}_spec = TrainSpec(
    name="$name",
    model_cls=${Cls}Model,
    flavors=flavors,
    tp_plan_fn=${name}_tp_plan,
    # Per-op selective activation checkpointing keeps these outputs (every other matmul).
    selective_ac_save_ops=("aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                           "aten._scaled_dot_product_flash_attention.default",
                           "aten._scaled_dot_product_efficient_attention.default"),
    config_model=${Cls}Section,
    validate_fn=validate_${name},
    flops_per_token_fn=flops_per_token,
    plugin_api_version="1.0",  # the titan-core plugin API this spec was written for
)
'''

TEST = '''"""Run titan-core's conformance checks on this spec (what `titan-plugin check $name` runs)."""

from titan_core.testing import TrainSpecConformance


class Test${Cls}(TrainSpecConformance):
    train_spec = "$name"
    fast = True  # the quick subset; set False (or run `titan-plugin check $name`) for every check
'''

README = '''# $dist

A titan-core model plugin: `titan-train --spec $name` trains a small pre-norm causal
decoder with every parallelism titan-core offers (FSDP2 / HSDP, TP from `tp_plan.py`,
activation checkpointing, compile).

```bash
pip install .
titan-plugin check $name          # the conformance checks (add --fast for the quick subset)
titan-train --spec $name --flavor debugmodel --training.steps=20
```

Files: `pyproject.toml` (the `titan.train_specs` entry point), `src/$pkg/model.py` (the
model), `src/$pkg/tp_plan.py` (its TP plan), `src/$pkg/spec.py` (flavors, the `[$name]`
section, the TrainSpec), `tests/test_conformance.py` (the checks inside pytest:
`pip install .[test] && pytest`).
'''

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "src/$pkg/__init__.py": INIT,
    "src/$pkg/model.py": MODEL,
    "src/$pkg/tp_plan.py": TP_PLAN,
    "src/$pkg/spec.py": SPEC,
    "tests/test_conformance.py": TEST,
}
