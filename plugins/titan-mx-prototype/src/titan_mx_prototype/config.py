"""The ``[mx]`` section: MXFP8 recipe, module selection and emulation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from titan_core.plugin.selection import filter_fqns_field, moe_fqns_field

AutoBool = Literal["auto"] | bool

#: The feed-forward projections of every block (Llama naming); see README for combining with float8.
DEFAULT_FQNS = ["feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]


class MXConfig(BaseModel):
    """MXFP8 training (torchao prototype) of bias-free nn.Linear layers.

    Candidates are bias-free ``nn.Linear`` whose weight dims are both divisible
    by the MX block size (32, fixed by torchao's MXFP8 training path). Entries of
    ``fqns`` / ``filter_fqns`` match a module when their dot-separated parts
    appear consecutively in its fully qualified name (as in ``[float8]``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    recipe: Literal["mxfp8_rceil", "mxfp8_rceil_wgrad_with_hp"] = Field(
        "mxfp8_rceil", description="torchao MXFP8 recipe: mxfp8_rceil, or mxfp8_rceil_wgrad_with_hp (weight gradient in high precision)."
    )
    fqns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_FQNS),
        description="Opt-in: only linears matching an entry are converted (default: the feed-forward projections of every block).",
    )
    filter_fqns: list[str] = filter_fqns_field()
    moe_fqns: list[str] = moe_fqns_field("MXFP8")
    emulate: AutoBool = Field(
        "auto", description="Emulate MXFP8 matmuls in high precision: auto = on CPU, real kernels on CUDA SM100+ (Blackwell); true = always (slow)."
    )

    @field_validator("emulate", mode="before")
    @classmethod
    def _auto_bool(cls, value: Any) -> Any:
        # "true"/"false" as typed on a command line
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "auto"):
            lowered = value.strip().lower()
            return lowered if lowered == "auto" else lowered == "true"
        return value
