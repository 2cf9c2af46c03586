"""A ``config.json`` that spells RoPE twice: ``rope_parameters`` (transformers 5) and the legacy ``rope_scaling``.

transformers' versions disagree on which one wins: 4.x reads ``rope_theta`` and
``rope_scaling``; 5.x (``PreTrainedConfig.convert_rope_params_to_dict``, 5.25 in this
project's environment) lets a non-empty ``rope_scaling`` replace ``rope_parameters`` and then
fills ``rope_theta`` with its default unless the chosen dict names one. So when both are
present and say different things, no reading is "the" reading: the same folder would give
different models in different tools. Such a file is refused with one message naming both
values. When they agree (titan's own exports write both spellings, equal) or only one is
set, it reads as every transformers version reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models.hf_names import finite_number

__all__ = ["check_rope_fields"]

_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
                 "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim")


def _same(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        # finite_number: an integer beyond any float made math.isfinite raise OverflowError
        return a == b or (finite_number(a) and finite_number(b) and math.isclose(a, b, rel_tol=1e-9))
    return bool(a == b)


def _rope_type(rope: Mapping[str, Any]) -> Any:
    return rope.get("rope_type", rope.get("type", "default"))


def check_rope_fields(config: Mapping[str, Any], path: Path, *, what: str) -> None:
    """ConfigError when rope_parameters, rope_scaling and rope_theta of ``config`` contradict each other."""
    params, legacy, theta = config.get("rope_parameters"), config.get("rope_scaling"), config.get("rope_theta")
    for key, value in (("rope_parameters", params), ("rope_scaling", legacy)):
        # An adapter reads the scaling's keys from an object; any other value set here (a string, a list) was
        # read as plain RoPE by an adapter that tests `isinstance(..., Mapping)`: a different model, silently.
        if value and not isinstance(value, Mapping):
            raise ConfigError(
                f"{what}: {path} sets {key}={value!r:.80}, which is not a JSON object. RoPE settings are an object "
                f'such as {{"rope_type": "yarn", "factor": 4.0, ...}} (or null, or no {key}, for plain RoPE); '
                f"fix {key} to the form the model was trained with.")
    fix = ("Keep one spelling (delete rope_scaling, or make it equal to rope_parameters without rope_theta) and "
           "check which one the model was trained with.")
    if isinstance(params, Mapping) and params and isinstance(legacy, Mapping) and legacy:
        differ = [] if _same(_rope_type(params), _rope_type(legacy)) else ["rope_type"]
        differ += [k for k in _SCALING_KEYS if (k in legacy or k in params) and not _same(params.get(k), legacy.get(k))]
        if not _same(params.get("rope_theta", theta), legacy.get("rope_theta", theta)):
            differ.append("rope_theta")
        if differ:
            raise ConfigError(
                f"{what}: {path} sets both rope_parameters and the legacy rope_scaling, and they disagree on "
                f"{', '.join(differ)} (rope_parameters={dict(params)}, rope_scaling={dict(legacy)}). transformers 4 "
                f"reads rope_scaling, transformers 5 reads rope_parameters unless rope_scaling is set, so the folder "
                f"means different models to different tools. {fix}")
    if isinstance(params, Mapping) and params and "rope_theta" in params and theta is not None \
            and not _same(params["rope_theta"], theta):
        raise ConfigError(
            f"{what}: {path} sets rope_theta={theta!r} but rope_parameters.rope_theta={params['rope_theta']!r}; "
            f"transformers 4 reads the first, transformers 5 the second. Make them equal (or drop the top-level "
            f"rope_theta), checking which base frequency the model was trained with.")
