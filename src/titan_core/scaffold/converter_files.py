"""The files of a new converter package (``titan-plugin new converter NAME``); ``$name`` etc. are filled in."""

from .pyproject_file import pyproject

PYPROJECT = pyproject(kind="converter", group="titan.model_converters", target="$pkg.converter:$cls",
                      comment="titan-train --converters $name imports\n# $pkg.converter and uses its $cls class.")

INIT = '''"""$dist: a titan-core converter plugin (entry point ``$name``)."""

from .config import ${Cls}Config
from .converter import $cls, ${Cls}Linear

__all__ = ["$cls", "${Cls}Config", "${Cls}Linear"]
'''

CONFIG = '''"""The ``[$name]`` config section: its defaults must validate on their own."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ${Cls}Config(BaseModel):
    """Which linears are converted, and how.

    An entry of ``fqns`` / ``filter_fqns`` matches a module when its dot-separated parts
    appear consecutively in the module's name (``"attention"`` matches ``layers.0.attention.wq``).
    """

    model_config = ConfigDict(extra="forbid")

    fqns: list[str] = Field(default_factory=list, description="Opt-in: if non-empty, only linears matching an entry are converted.")
    filter_fqns: list[str] = Field(default_factory=lambda: ["output"],
                                   description="Opt-out: linears matching an entry are never converted (default: the output head).")
    mantissa_bits: int = Field(7, ge=1, le=23, description="Mantissa bits the weights are rounded to in the forward (7 = bfloat16).")
'''

CONVERTER = '''"""$cls: rewrites the selected nn.Linear modules into ${Cls}Linear (on the meta device).

Replace ``${Cls}Linear.forward`` with your technique. The layer stays an ``nn.Linear``
subclass with the same parameters, so parameter names, FSDP2 sharding, torch's
tensor-parallel styles and checkpoints work unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core import ModelConverter, select_linears

from .config import ${Cls}Config


def round_mantissa(w: torch.Tensor, bits: int) -> torch.Tensor:
    """``w`` rounded to ``bits`` mantissa bits, with a straight-through gradient."""
    mantissa, exponent = torch.frexp(w)
    scale = float(2 ** (bits + 1))
    rounded = torch.ldexp(torch.round(mantissa * scale) / scale, exponent)
    return w + (rounded - w).detach()


class ${Cls}Linear(nn.Linear):
    """An nn.Linear whose forward uses its weight rounded to ``mantissa_bits`` bits."""

    mantissa_bits: int = 7

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, round_mantissa(self.weight, self.mantissa_bits), self.bias)


class $cls(ModelConverter[${Cls}Config]):  # the type argument is the config: self.config is a ${Cls}Config
    plugin_api_version = "1.0"  # the titan-core plugin API this converter was written for
    prototype = False  # True: `titan-train --list` tags it [prototype] (an experiment, not for production runs)

    def selection_keys(self) -> list[str]:
        return ["fqns", "filter_fqns"]

    def select(self, model: nn.Module) -> list[str]:
        config = self.config  # validated by the base class
        return select_linears(model, section="$name", fqns=config.fqns, filter_fqns=config.filter_fqns,
                              eligible=lambda fqn, module: not isinstance(module, ${Cls}Linear))

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            module = model.get_submodule(fqn)
            # Swapping the class keeps the module object, its (meta) parameters and their names.
            module.__class__ = ${Cls}Linear
            assert isinstance(module, ${Cls}Linear)  # it is now; this also tells a type checker
            module.mantissa_bits = self.config.mantissa_bits
'''

TEST = '''"""Run titan-core's conformance checks on this converter (what `titan-plugin check $name` runs)."""

from titan_core.testing import ConverterConformance


class Test${Cls}(ConverterConformance):
    converter = "$name"
    fast = True  # the quick subset; set False (or run `titan-plugin check $name`) for every check
'''

README = '''# $dist

A titan-core converter plugin: `titan-train --converters $name` rounds the weights of
the selected linears to `$name.mantissa_bits` mantissa bits in the forward pass.

```bash
pip install .
titan-plugin check $name          # the conformance checks (add --fast for the quick subset)
titan-train --converters $name --dry-run
```

Files: `pyproject.toml` (the `titan.model_converters` entry point), `src/$pkg/config.py`
(the `[$name]` section), `src/$pkg/converter.py` (the converter and its layer),
`tests/test_conformance.py` (the checks inside pytest: `pip install .[test] && pytest`).
'''

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "src/$pkg/__init__.py": INIT,
    "src/$pkg/config.py": CONFIG,
    "src/$pkg/converter.py": CONVERTER,
    "tests/test_conformance.py": TEST,
}
