"""The one door into plugin code: every call the core makes into a spec or a converter.

A plugin is untrusted code. Each method here calls one plugin function under
:func:`~titan_core.plugin.guard.plugin_call` (an exception becomes one ``PluginError`` naming
the plugin and the function; a hang meets ``model.plugin_timeout_s``), checks what it returned
(``select`` gives module names, ``convert`` rewrites in place, ``parallelize_fn`` gives a module,
the forward gives ``[batch, seq, vocab]`` logits), and passes only the keyword arguments the
function accepts (:func:`~titan_core.plugin.guard.call_accepting`), so a plugin written before a
keyword existed keeps working without a hand-made shim.

``SpecCalls`` is built once per run by ``resolve_config`` (``ResolvedConfig.calls``); tools that
hold only a spec (``titan-convert``, the starting weights) build their own, which costs nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..errors import PluginError
from ..models.init import init_model_weights
from ..models.model_parts import head_was_handed_over
from ..models.ties import declared_ties
from ..parallel import spec_parallelize_fn
from ..plugin.discovery import CONVERTERS, SPECS
from ..plugin.guard import accepts_keyword, call_accepting, check_logits, named_by, plugin_call, plugin_label
from ..plugin.protocols import ModelConverter, TensorParallelStyles, TrainSpec
from ..plugin.spec_factories import FlopsPerToken

if TYPE_CHECKING:
    from ..config.sections import DataSection, LRSchedulerSection, OptimizerSection
    from ..plugin.spec_factories import (
        DataLoader,
        LossFn,
        LRSchedulers,
        MetricsProcessor,
        Pipeline,
        StateDictAdapter,
        Tokenizer,
    )

__all__ = ["CheckedAdapter", "ConverterCalls", "SpecCalls"]


class SpecCalls:
    """The calls into one TrainSpec's code (its factories and its model), guarded and checked."""

    def __init__(self, spec: TrainSpec) -> None:
        self.spec = spec

    def guard(self, method: str, *, timed: bool = False) -> contextlib.AbstractContextManager[None]:
        """``timed``: under ``model.plugin_timeout_s`` too (the set-up steps and the forward, which may hang on a
        collective); the quick calls (a factory, the model's constructor on meta) are guarded but not timed."""
        return plugin_call(SPECS, self.spec.name, method, timed=timed)

    def build_model(self, model_args: object) -> nn.Module:
        """``model_cls(model_args)`` (under whatever device context the caller set, e.g. meta)."""
        with self.guard("model_cls(model_args)"):
            model = self.spec.model_cls(model_args)
            _expect(isinstance(model, nn.Module), model, "an nn.Module")
        return model

    def tied_weights(self, model: nn.Module) -> list[tuple[str, str]]:
        with self.guard("the model's tied_weights()"):
            return declared_ties(model)

    def validate(self, model_args: object, *, added: Mapping[str, object] | None = None, **facts: object) -> None:
        """The spec's ``validate_fn``: a ConfigError from it is the user's, passed on as is. ``added``: keywords
        of a later API minor, for a function that names them (``named_by``); so in each method here."""
        if self.spec.validate_fn is not None:
            with self.guard("validate_fn"):
                call_accepting(self.spec.validate_fn, model_args, **facts, **named_by(self.spec.validate_fn, added))

    def tokenizer(self, data: DataSection) -> Tokenizer | None:
        """The spec's tokenizer; None when it leaves that to the core."""
        if self.spec.build_tokenizer_fn is None:
            return None
        with self.guard("build_tokenizer_fn"):
            tokenizer = self.spec.build_tokenizer_fn(data)
            _expect(all(hasattr(tokenizer, a) for a in ("encode", "vocab_size", "eos_id")), tokenizer,
                    "a tokenizer (encode, vocab_size, eos_id)")
        return tokenizer

    def loss_fn(self) -> LossFn | None:
        if self.spec.build_loss_fn is None:
            return None
        with self.guard("build_loss_fn"):
            fn = self.spec.build_loss_fn()
            _expect(callable(fn), fn, "a loss function")
        return fn

    def dataloader(self, **options: object) -> DataLoader | None:
        if self.spec.build_dataloader_fn is None:
            return None
        with self.guard("build_dataloader_fn"):
            loader = call_accepting(self.spec.build_dataloader_fn, **options)
            _expect(hasattr(loader, "__iter__"), loader, "an iterable data loader")
        return loader

    def parallelize(self, part: nn.Module, *, added: Mapping[str, object] | None = None,
                    **options: object) -> nn.Module:
        """The spec's ``parallelize_fn`` (or the core's default built from its TP plan) on one part."""
        with self.guard("parallelize_fn", timed=True):
            fn = spec_parallelize_fn(self.spec)
            out = call_accepting(fn, part, **options, **named_by(fn, added))
            _expect(isinstance(out, nn.Module), out, "the parallelized nn.Module")
        return out

    def pipeline(self, model: nn.Module, *, added: Mapping[str, object] | None = None, **options: object) -> Pipeline:
        fn = self.spec.pipelining_fn
        assert fn is not None  # a spec without one was refused by resolve_config for pp > 1
        with self.guard("pipelining_fn"):
            pipe = call_accepting(fn, model, **options, **named_by(fn, added))
            parts = getattr(pipe, "model_parts", None)
            _expect(isinstance(parts, list) and all(isinstance(p, nn.Module) for p in parts)
                    and hasattr(pipe, "schedule"), pipe, "a Pipeline (schedule and model_parts, a list of modules)")
        return pipe

    def init_weights(self, part: nn.Module, *, seed: int, buffers_only: bool) -> None:
        with self.guard("the model's init_parameter/init_buffers", timed=True):
            init_model_weights(part, seed=seed, buffers_only=buffers_only)

    def forward(self, model: nn.Module, inputs: torch.Tensor, *, vocab: int | None = None,
                **kwargs: torch.Tensor) -> torch.Tensor:
        """The model's forward, whose logits must be ``[batch, seq, vocab]`` for ``[batch, seq]`` inputs (``vocab``:
        the least width, checked when given and the forward did not hand its head to the core's chunked loss)."""
        with self.guard("the model's forward", timed=True):
            logits: object = model(inputs, **kwargs)
        check_logits(logits, inputs, spec=self.spec.name, vocab=None if head_was_handed_over() else vocab)
        return cast(torch.Tensor, logits)  # check_logits refused anything else

    def optimizers(self, model_parts: list[nn.Module], config: OptimizerSection, *,
                   device_type: str) -> torch.optim.Optimizer | None:
        if self.spec.build_optimizers_fn is None:
            return None
        with self.guard("build_optimizers_fn", timed=True):
            opt = call_accepting(self.spec.build_optimizers_fn, model_parts, config, device_type=device_type)
            _expect(isinstance(opt, torch.optim.Optimizer), opt, "a torch.optim.Optimizer")
        return opt

    def lr_schedulers(self, optimizer: torch.optim.Optimizer, config: LRSchedulerSection, *,
                      total_steps: int) -> LRSchedulers | None:
        if self.spec.build_lr_schedulers_fn is None:
            return None
        with self.guard("build_lr_schedulers_fn", timed=True):
            out = call_accepting(self.spec.build_lr_schedulers_fn, optimizer, config, total_steps=total_steps)
            _expect(all(hasattr(out, a) for a in ("step", "state_dict")), out, "LR schedulers (step, state_dict)")
        return out

    def metrics(self, config: object, **options: object) -> MetricsProcessor | None:
        if self.spec.build_metrics_processor_fn is None:
            return None
        with self.guard("build_metrics_processor_fn"):
            out = call_accepting(self.spec.build_metrics_processor_fn, config, **options)
            _expect(all(hasattr(out, a) for a in ("log_step", "should_log")), out, "a metrics processor")
        return out

    def flops_per_token(self, model_args: object, seq_len: int) -> FlopsPerToken | None:
        """Both counts; a function without the ``full_attention`` keyword has one, used for both."""
        fn = self.spec.flops_per_token_fn
        if fn is None:
            return None

        def count(full: bool) -> float:
            with self.guard("flops_per_token_fn"):
                value = call_accepting(fn, model_args, seq_len, full_attention=full)
                _expect(isinstance(value, (int, float)) and not isinstance(value, bool), value, "a number")
            return float(value)

        computed = count(False)
        return FlopsPerToken(computed, count(True) if accepts_keyword(fn, "full_attention") else computed)


class CheckedAdapter:
    """A spec's ``state_dict_adapter`` whose four methods are guarded (built by ``hf.adapter.adapter_of``)."""

    def __init__(self, spec_name: str, adapter: StateDictAdapter) -> None:
        self.spec_name, self.inner = spec_name, adapter
        self.runtime_fields: tuple[str, ...] = tuple(getattr(adapter, "runtime_fields", ()))

    def _call(self, method: str, *args: object) -> Any:
        with plugin_call(SPECS, self.spec_name, f"state_dict_adapter.{method}", timed=False):
            return getattr(self.inner, method)(*args)

    def model_args_from_hf(self, config: Mapping[str, Any]) -> Any:
        return self._call("model_args_from_hf", config)

    def hf_config(self, model_args: object) -> dict[str, Any]:
        out = self._call("hf_config", model_args)
        if not isinstance(out, Mapping):
            raise PluginError(_returned(plugin_label(SPECS, self.spec_name), "state_dict_adapter.hf_config", out,
                                        "a dict (config.json)"))
        return dict(out)

    def from_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: object) -> dict[str, torch.Tensor]:
        return self._tensors("from_hf", state_dict, model_args)

    def to_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: object) -> dict[str, torch.Tensor]:
        return self._tensors("to_hf", state_dict, model_args)

    def _tensors(self, method: str, state_dict: Mapping[str, torch.Tensor], model_args: object) -> dict[str, torch.Tensor]:
        out = self._call(method, state_dict, model_args)
        if not isinstance(out, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                   for k, v in out.items()):
            raise PluginError(_returned(plugin_label(SPECS, self.spec_name), f"state_dict_adapter.{method}", out,
                                        "a dict of name -> tensor"))
        return dict(out)

    @property
    def from_hf_rows(self) -> Callable[..., torch.Tensor | None] | None:
        # Optional, and its NotImplementedError means "read the tensor whole": row_map checks its result.
        fn: Callable[..., torch.Tensor | None] | None = getattr(self.inner, "from_hf_rows", None)
        return fn

    @property
    def hf_stacked_name(self) -> Callable[[str], tuple[str, int] | None] | None:
        return self._optional("hf_stacked_name")

    @property
    def hf_expert_name(self) -> Callable[[str, int], str | None] | None:
        return self._optional("hf_expert_name")

    def _optional(self, method: str) -> Callable[..., Any] | None:
        """An optional adapter method, guarded; None when the adapter has none."""
        if getattr(self.inner, method, None) is None:
            return None
        return lambda *args: self._call(method, *args)


class ConverterCalls:
    """The calls into one converter, constructed from its class and its section of the config."""

    def __init__(self, name: str, converter: ModelConverter[Any]) -> None:
        self.name, self.converter = name, converter

    @classmethod
    def construct(cls, name: str, converter_cls: type[ModelConverter[Any]], config: object,
                  **context: object) -> ConverterCalls:
        with plugin_call(CONVERTERS, name, "__init__"):  # timed, as each set-up step is
            return cls(name, call_accepting(converter_cls, config, **context))

    def guard(self, method: str, *, timed: bool = False) -> contextlib.AbstractContextManager[None]:
        return plugin_call(CONVERTERS, self.name, method, timed=timed)

    def compatible_with(self, spec: TrainSpec) -> None:
        with self.guard("compatible_with()", timed=True):
            self.converter.compatible_with(spec)

    def select(self, model: nn.Module) -> list[str]:
        """The names it selects, in order, repeats dropped."""
        with self.guard("select()", timed=True):
            chosen = self.converter.select(model)
            if not isinstance(chosen, (list, tuple)) or not all(isinstance(f, str) for f in chosen):
                raise TypeError(f"it returned {type(chosen).__name__} {str(chosen)[:80]!r}, not a list of "
                                f"module names (str)")
        return list(dict.fromkeys(chosen))

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        with self.guard("convert()", timed=True):
            returned: object = self.converter.convert(model, fqns)
        if returned is not None and returned is not model:
            # The core keeps its own model object; a converted copy handed back would be dropped unseen.
            raise PluginError(
                f"{plugin_label(CONVERTERS, self.name)} returned a {type(returned).__name__} from convert() instead "
                f"of rewriting the model in place; the core keeps its own model, so the conversion would be lost. "
                f"Change the modules of the model it is given (e.g. setattr on their parents) and return None."
            )

    def selection_keys(self) -> list[str]:
        with self.guard("selection_keys()"):
            keys = self.converter.selection_keys()
            _expect(isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys), keys,
                    "a list of config field names")
        return list(keys)

    def tensor_parallel_styles(self) -> TensorParallelStyles | None:
        with self.guard("tensor_parallel_styles()"):
            styles = self.converter.tensor_parallel_styles()
            _expect(styles is None or isinstance(styles, TensorParallelStyles), styles,
                    "None or a TensorParallelStyles")
        return styles

    def optimizer_hook(self, hook: str, model_parts: list[nn.Module]) -> Callable[..., None] | None:
        """An optimizer step hook calling the converter's ``hook`` (guarded); None when it keeps the base one."""
        bound = getattr(self.converter, hook)
        # The underlying function, so that an override set on the instance in __init__ counts too.
        if getattr(bound, "__func__", bound) is getattr(ModelConverter, hook):
            return None

        def step_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            with self.guard(hook, timed=True):  # every step, as the forward: a hook that never returns is named
                bound(model_parts)

        return step_hook


def converter_calls(converters: Sequence[tuple[str, ModelConverter[Any]] | ModelConverter[Any]]) -> list[ConverterCalls]:
    """Name each converter (a bare one by its class, for tests and notebooks)."""
    return [ConverterCalls(*c) if isinstance(c, tuple) else ConverterCalls(type(c).__name__, c) for c in converters]


def _returned(label: str, method: str, value: object, wanted: str) -> str:
    return (f"{label} failed in {method}: it returned {type(value).__name__} {str(value)[:80]!r}, not {wanted}. "
            f"This is a problem in the plugin: update it, or report it to its authors.")


def _expect(ok: bool, value: object, wanted: str) -> None:
    """Inside a guard: a TypeError there becomes the plugin's PluginError naming the function."""
    if not ok:
        raise TypeError(f"it returned {type(value).__name__}, not {wanted}")

