"""titan-int8-fake: an example third-party converter (``[int8fake]``) for titan-core.

Selected ``nn.Linear`` layers become ``Int8FakeQuantLinear``: the forward uses
weights rounded to a symmetric per-output-channel int grid (quantize then
dequantize); the backward passes gradients straight through the rounding.
"""

from __future__ import annotations

from .config import Int8FakeConfig
from .converter import Int8FakeConverter
from .layer import Int8FakeQuantLinear, fake_quantize

__all__ = ["Int8FakeConfig", "Int8FakeConverter", "Int8FakeQuantLinear", "fake_quantize"]
