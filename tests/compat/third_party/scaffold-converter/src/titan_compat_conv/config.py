"""The ``[compat_conv]`` config section: its defaults must validate on their own."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CompatConvConfig(BaseModel):
    """Which linears are converted, and how.

    An entry of ``fqns`` / ``filter_fqns`` matches a module when its dot-separated parts
    appear consecutively in the module's name (``"attention"`` matches ``layers.0.attention.wq``).
    """

    model_config = ConfigDict(extra="forbid")

    fqns: list[str] = Field(default_factory=list, description="Opt-in: if non-empty, only linears matching an entry are converted.")
    filter_fqns: list[str] = Field(default_factory=lambda: ["output"],
                                   description="Opt-out: linears matching an entry are never converted (default: the output head).")
    mantissa_bits: int = Field(7, ge=1, le=23, description="Mantissa bits the weights are rounded to in the forward (7 = bfloat16).")
