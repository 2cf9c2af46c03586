"""lm-evaluation-harness's ``LM`` interface over a titan model, registered in lm_eval as ``titan``.

Importing this module imports lm_eval (the optional extra ``lmeval``) and registers the model;
nothing else in the core imports it at import time (``titan-lm-eval`` imports it when it runs).
The model is loaded as titan-eval loads it (a titan checkpoint, a run folder's newest checkpoint
or a Hugging Face folder, in float32) and scored with titan-eval's own code:

- ``loglikelihood``: each (context, continuation) becomes one titan evaluation request (the
  context encoded with BOS, the continuation on its own), so a multiple-choice task gives the
  log-likelihoods titan-eval gives for the same examples.
- ``loglikelihood_rolling``: the document encoded with BOS, cut by lm_eval's rolling windows of
  the model's positions (every token predicted once, the last window given a full context), each
  window scored as a request; the document's figure is their sum.
- ``generate_until``: a continuation from titan's sampler (a KV cache when the model takes one),
  stopped at the first ``until`` string, the end-of-document token or ``max_gen_toks``. Greedy unless
  the task's ``generation_kwargs`` ask for sampling (``do_sample: true``, or a ``temperature`` above 0
  with ``do_sample`` unset, as lm_eval's Hugging Face model reads them): then at ``temperature``
  (default 1.0) among the ``top_k`` most likely tokens (default all), each request from the generator
  seeded with ``seed`` (the task's, else the model argument's, default 0), so a rerun gives the same
  text. Nucleus sampling (``top_p`` below 1) is refused: titan's sampler has none.

One process: lm_eval's data-parallel launch (accelerate) is not supported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  (lm_eval's own table of models: it skips it once any model is registered)
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string

from ..errors import ConfigError
from ..evaluation.requests import Request
from ..evaluation.scoring import score_requests
from ..models.sampling import Sampling, sample, takes_cache
from ..plugin.spec_factories import Tokenizer
from ..train.evaluation import model_window
from .model_source import LoadedSource, load_model

NAME = "titan"
WHAT = "lm_eval --model titan"
DEFAULT_WINDOW = 2048  # titan-eval's, for a model that names no max_seq_len
LM_EVAL_DEFAULT_DEVICE = "cuda:0"  # what lm_eval's CLI passes when --device is left out
MODEL_ARGS = ("checkpoint", "config", "spec", "device", "batch_size", "max_gen_toks", "seed")


def _positive(value: object, name: str) -> int:
    """A model argument that must be a positive whole number (lm_eval hands them over parsed or as text)."""
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if number <= 0:
        raise ConfigError(f"{WHAT}: {name}={value!r} must be a positive whole number (batch_size=auto is not "
                          f"supported); e.g. --model_args checkpoint=runs/x,{name}=8.")
    return number


def _number(value: object, name: str, *, minimum: float) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = float("nan")
    if not number >= minimum or number == float("inf") or isinstance(value, bool):
        raise ConfigError(f"{WHAT}: {name}={value!r} must be a number of at least {minimum:g}.")
    return number


def _seed(value: object) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
        raise ConfigError(f"{WHAT}: seed={value!r} must be a whole number of at least 0.")
    seed = int(value)
    if not 0 <= seed < 2**63:
        raise ConfigError(f"{WHAT}: seed={value!r} must be a whole number of at least 0, below 2**63.")
    return seed


@register_model(NAME)
class TitanLM(LM):  # type: ignore[misc]  # lm_eval ships no type information: LM is Any to mypy
    """``--model_args checkpoint=PATH[,device=cpu,batch_size=8,max_gen_toks=256,config=TOML,spec=NAME]``."""

    def __init__(self, checkpoint: object = None, config: object = None, spec: object = None,
                 device: object = None, batch_size: object = 8, max_gen_toks: object = 256, seed: object = 0,
                 max_batch_size: object = None, **unknown: object) -> None:
        super().__init__()
        del max_batch_size  # lm_eval passes it for batch_size=auto, which titan does not do
        if unknown:
            raise ConfigError(f"{WHAT}: unknown model argument {', '.join(sorted(unknown))}; the titan model takes "
                              f"{', '.join(MODEL_ARGS)}.")
        if checkpoint is None or not str(checkpoint):
            raise ConfigError(f"{WHAT} needs the model to read: --model_args checkpoint=PATH, a titan checkpoint "
                              f"(runs/x/checkpoints/step-N), a run folder or a Hugging Face folder.")
        self.batch_size: int = _positive(batch_size, "batch_size")
        self.max_gen_toks: int = _positive(max_gen_toks, "max_gen_toks")
        self.seed: int = _seed(seed)
        self.loaded: LoadedSource = load_model(Path(str(checkpoint)), config=Path(str(config)) if config else None,
                                 spec=str(spec) if spec else None, device_name=str(device or "cpu"), prog=WHAT)
        self.tokenizer: Tokenizer = self.loaded.whole.tokenizer
        self.window: int = model_window(self.loaded.whole.model_args, DEFAULT_WINDOW)
        self.loaded.model.eval()
        self._device = self.loaded.device

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> TitanLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
                            ) -> TitanLM:
        # lm_eval's CLI always passes its own --batch_size (default 1) and --device: a value given in
        # --model_args wins over them instead of colliding with them.
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        if extra.get("device") == LM_EVAL_DEFAULT_DEVICE:
            if not torch.cuda.is_available():  # lm_eval asks for cuda:0 when --device is left out
                print(f"[{WHAT}] this torch sees no CUDA device: running on cpu (lm_eval's default device is "
                      f"{LM_EVAL_DEFAULT_DEVICE})", file=sys.stderr)
                extra["device"] = "cpu"
        return cls(**arg_dict, **extra)

    @property
    def max_length(self) -> int:
        return self.window

    def _score(self, requests: Sequence[Request]) -> tuple[list[float], list[bool]]:
        if not requests:
            return [], []
        with torch.no_grad():
            scores = score_requests(requests, self.loaded.model, window=self.window, batch_size=self.batch_size,
                                    device=self.loaded.device, pad_id=self.tokenizer.eos_id)
        return scores.loglikelihood, scores.greedy

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        """(log p(continuation | context), whether greedy decoding gives the continuation) per request."""
        scored: list[Request] = []
        at: list[int | None] = []  # each lm_eval request's index among the scored ones; None: empty continuation
        for instance in requests:
            context, continuation = instance.args
            targets = tuple(self.tokenizer.encode(continuation))
            if not targets:
                at.append(None)  # nothing to predict: probability 1
                continue
            if len(targets) > self.window:
                raise ConfigError(f"{WHAT}: a continuation of {len(targets)} tokens is longer than the {self.window} "
                                  f"positions the model reads at once; it cannot be scored.")
            at.append(len(scored))
            scored.append(Request(tuple(self.tokenizer.encode(context, bos=True)), targets))
        lls, greedy = self._score(scored)
        return [(0.0, True) if i is None else (lls[i], greedy[i]) for i in at]

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        """Each document's summed log-likelihood after the BOS token, over windows of the model's positions."""
        scored: list[Request] = []
        spans: list[tuple[int, int]] = []
        for instance in requests:
            (text,) = instance.args
            tokens = self.tokenizer.encode(text, bos=True)
            windows = get_rolling_token_windows(token_list=tokens[1:], prefix_token=tokens[0],
                                                max_seq_len=self.window, context_len=1)
            start = len(scored)
            scored.extend(Request(tuple(context), tuple(predicted))
                          for context, predicted in map(make_disjoint_window, windows))
            spans.append((start, len(scored)))
        lls, _ = self._score(scored)
        return [sum(lls[start:end]) for start, end in spans]

    def generate_until(self, requests: list[Any]) -> list[str]:
        """A greedy continuation of each context, cut before the first of its ``until`` strings."""
        out: list[str] = []
        for instance in requests:
            context, gen_kwargs = instance.args
            out.append(self._continue(context, dict(gen_kwargs or {})))
        return out

    def sampling(self, gen_kwargs: dict[str, Any], new_tokens: int) -> Sampling:
        """How to pick each token, from a task's ``generation_kwargs`` (see the module's docstring)."""
        temperature = _number(gen_kwargs.get("temperature", 0.0), "temperature", minimum=0.0)
        do_sample = gen_kwargs.get("do_sample")
        if do_sample is None:
            do_sample = temperature > 0.0
        elif not isinstance(do_sample, bool):
            raise ConfigError(f"{WHAT}: do_sample={do_sample!r} must be true or false.")
        if not do_sample:
            return Sampling(max_new_tokens=new_tokens)
        top_p = _number(gen_kwargs.get("top_p", 1.0), "top_p", minimum=0.0)
        if top_p < 1.0:
            raise ConfigError(f"{WHAT}: top_p={top_p} (nucleus sampling) is not supported: titan's sampler takes "
                              f"temperature and top_k. Drop top_p from the task's generation_kwargs "
                              f"(--gen_kwargs top_p=1.0).")
        top_k = gen_kwargs.get("top_k")
        if top_k is not None and (isinstance(top_k, bool) or not str(top_k).isdigit()):
            raise ConfigError(f"{WHAT}: top_k={top_k!r} must be a whole number (0: every token).")
        return Sampling(max_new_tokens=new_tokens, temperature=temperature or 1.0,
                        top_k=int(str(top_k)) or None if top_k is not None else None,
                        seed=_seed(gen_kwargs.get("seed", self.seed)))

    def _continue(self, context: str, gen_kwargs: dict[str, Any]) -> str:
        until = gen_kwargs.get("until") or []
        stops = [until] if isinstance(until, str) else [str(s) for s in until]
        new_tokens = min(_positive(gen_kwargs.get("max_gen_toks", self.max_gen_toks), "max_gen_toks"),
                         self.window - 1)
        prompt = self.tokenizer.encode(context, bos=True)[-(self.window - new_tokens):]  # the newest context fits

        def reached_stop(new: list[int]) -> bool:
            text = self.tokenizer.decode(new)
            return any(s in text for s in stops)

        new = sample(self.loaded.model, prompt, self.sampling(gen_kwargs, new_tokens), eos_id=self.tokenizer.eos_id,
                     use_cache=takes_cache(self.loaded.model), stop=reached_stop if stops else None)
        if new and new[-1] == self.tokenizer.eos_id:
            new = new[:-1]  # the end-of-document token is not text
        text = self.tokenizer.decode(new)
        for s in stops:
            text = text.split(s, 1)[0]
        return text
