"""The ``[int8fake]`` section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Int8FakeConfig(BaseModel):
    """Which linears get fake-quantized weights, and to how many bits.

    An entry of ``fqns`` / ``filter_fqns`` matches a module when its
    dot-separated parts appear consecutively in the module's fully qualified
    name (``"feed_forward"`` matches ``layers.0.feed_forward.w1``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    fqns: list[str] = Field(default_factory=list, description="Opt-in: if non-empty, only linears matching an entry are converted.")
    filter_fqns: list[str] = Field(default_factory=lambda: ["output"],
                                   description="Opt-out: linears matching an entry are never converted (default: the output head).")
    bits: int = Field(8, ge=2, le=8, description="Bits of the symmetric signed weight grid (8 = int8: -127..127 times a per-row scale).")
