"""The plugin facade (plugin_boundary.py) without a run: keyword filtering, the flops counts, the adapter's guard.

The end-to-end cases (a hostile plugin for each guarded call, through the CLI) are in
tests/test_hostile_inputs.py (``IN_PROCESS``); these cover what needs no training run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from titan_core import PluginError
from titan_core.boundary.plugin_boundary import CheckedAdapter, SpecCalls
from titan_core.hf.adapter import row_map
from titan_core.plugin.guard import call_accepting
from titan_core.testing.tiny_spec import TINY_SPEC


def test_a_plugin_function_gets_only_the_keywords_it_accepts() -> None:
    def old(a: int, b: int) -> tuple[int, int]:
        return a, b

    def new(a: int, *, b: int, extra: str) -> tuple[int, int, str]:
        return a, b, extra

    def open_ended(a: int, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    assert call_accepting(old, 1, b=2, extra="x") == (1, 2)
    assert call_accepting(new, 1, b=2, extra="x") == (1, 2, "x")
    assert call_accepting(open_ended, 1, b=2, extra="x") == {"b": 2, "extra": "x"}


def test_flops_of_a_function_without_full_attention_is_one_count_used_for_both() -> None:
    seen: list[dict[str, Any]] = []

    def legacy(args: Any, seq_len: int) -> float:
        seen.append({"seq_len": seq_len})
        return 600.0

    def current(args: Any, seq_len: int, *, full_attention: bool) -> float:
        seen.append({"full_attention": full_attention})
        return 1000.0 if full_attention else 700.0

    flops = SpecCalls(dataclasses.replace(TINY_SPEC, flops_per_token_fn=legacy)).flops_per_token(None, 8)
    assert flops is not None and (flops.computed, flops.full_attention) == (600.0, 600.0)
    assert seen == [{"seq_len": 8}]  # called once, without the keyword
    seen.clear()
    flops = SpecCalls(dataclasses.replace(TINY_SPEC, flops_per_token_fn=current)).flops_per_token(None, 8)
    assert flops is not None and (flops.computed, flops.full_attention) == (700.0, 1000.0)
    assert seen == [{"full_attention": False}, {"full_attention": True}]
    assert SpecCalls(dataclasses.replace(TINY_SPEC, flops_per_token_fn=None)).flops_per_token(None, 8) is None


class _Adapter:
    runtime_fields = ("rope_len",)

    def model_args_from_hf(self, config: Any) -> Any:
        raise KeyError("hidden_size")

    def hf_config(self, model_args: Any) -> Any:
        return ["not", "a", "dict"]

    def from_hf(self, state_dict: Any, model_args: Any) -> Any:
        return {"w": "not a tensor"}

    def to_hf(self, state_dict: Any, model_args: Any) -> Any:
        return dict(state_dict)

    def from_hf_rows(self, key: str, shape: tuple[int, ...], args: Any) -> torch.Tensor | None:
        raise NotImplementedError  # "read this tensor whole": not an error


def test_the_adapter_behind_the_facade_names_the_spec_and_the_method() -> None:
    adapter = CheckedAdapter("tinyspec", _Adapter())
    with pytest.raises(PluginError, match=r'spec "tinyspec" failed in state_dict_adapter.model_args_from_hf: '
                                          r"KeyError: 'hidden_size'"):
        adapter.model_args_from_hf({})
    with pytest.raises(PluginError, match=r"failed in state_dict_adapter.hf_config: it returned list .* not a dict"):
        adapter.hf_config(None)
    with pytest.raises(PluginError, match=r"failed in state_dict_adapter.from_hf: .* not a dict of name -> tensor"):
        adapter.from_hf({}, None)
    t = torch.zeros(2)
    assert adapter.to_hf({"w": t}, None) == {"w": t}
    assert adapter.runtime_fields == ("rope_len",)
    assert adapter.hf_stacked_name is None and adapter.hf_expert_name is None  # optional methods it lacks
    assert row_map(adapter, "w", (4, 3), (4, 3), None) is None  # NotImplementedError still means "read whole"
