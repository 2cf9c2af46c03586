"""The ``[float8]`` section: recipe, module selection, emulation and FSDP all-gather."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from titan_core.plugin.selection import filter_fqns_field, moe_fqns_field

AutoBool = Literal["auto"] | bool


def parse_auto_bool(value: Any) -> Any:
    """Accept "auto", booleans and the strings "true"/"false" (as typed on a command line)."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        return lowered
    return value


class Float8Config(BaseModel):
    """Float8 training of nn.Linear layers with torchao.

    Selection: a module is a candidate when it is an ``nn.Linear`` whose weight
    dims are both divisible by 16. An entry of ``fqns`` / ``filter_fqns`` matches
    a module when the entry's dot-separated parts appear consecutively in the
    module's fully qualified name: ``"output"`` matches ``output``,
    ``"feed_forward.w1"`` matches ``layers.3.feed_forward.w1``, ``"layers.1"``
    matches every module under ``layers.1`` (but not ``layers.10``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] = Field(
        "tensorwise", description="torchao float8 recipe: tensorwise (fastest), rowwise, rowwise_with_gw_hp (most accurate)."
    )
    fqns: list[str] = Field(
        default_factory=list,
        description="Opt-in: if non-empty, only linears matching an entry are converted (an entry matches whole dot-separated parts of a module name).",
    )
    filter_fqns: list[str] = filter_fqns_field()
    moe_fqns: list[str] = moe_fqns_field("float8 rowwise")
    auto_filter_small_kn: bool = Field(
        False, description="Skip linears too small to gain from float8 (torchao's size heuristic for the recipe; not for rowwise_with_gw_hp)."
    )
    emulate: AutoBool = Field(
        "auto", description="Emulate float8 matmuls in float32: auto = on CPU, real kernels on CUDA SM89+; true = always emulate (slow)."
    )
    fsdp_float8_all_gather: AutoBool = Field(
        "auto", description="All-gather FSDP2 weights in float8: auto = on with nccl, FSDP (dp_shard > 1) and recipe tensorwise."
    )

    @field_validator("emulate", "fsdp_float8_all_gather", mode="before")
    @classmethod
    def _auto_bool(cls, value: Any) -> Any:
        return parse_auto_bool(value)
