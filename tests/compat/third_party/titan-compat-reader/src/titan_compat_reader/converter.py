"""compat_reader_conv: a converter that reads everything 1.0 handed a converter (its own
``__init__``, as 1.0's guide allowed) and swaps the selected linears for an identical subclass."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from titan_core import EmptyConfig, ModelConverter, select_linears

from .documented import read, read_dims


class ReadLinear(nn.Linear):
    """An nn.Linear by another name: the conversion changes the class and nothing else."""


class ReaderConverter(ModelConverter[EmptyConfig]):
    plugin_api_version = "1.0"

    def __init__(self, config: Any, *, parallel_dims: Any, job: Any) -> None:
        super().__init__(config, parallel_dims=parallel_dims, job=job)
        read_dims(parallel_dims)
        assert isinstance(job.device, torch.device) and job.device.type in ("cpu", "cuda")
        assert job.backend in ("gloo", "nccl")  # documented as resolved, never "auto"
        read("training", job.training)
        read("parallelism", job.parallelism)
        read("compile", job.compile)

    def select(self, model: nn.Module) -> list[str]:
        return select_linears(model, section="compat_reader_conv", fqns=[], filter_fqns=["output"],
                              eligible=lambda fqn, module: not isinstance(module, ReadLinear))

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            model.get_submodule(fqn).__class__ = ReadLinear
