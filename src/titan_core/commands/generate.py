"""``titan-generate SOURCE --prompt TEXT``: a continuation of TEXT sampled from a trained model.

SOURCE is a titan checkpoint (a ``step-N`` folder, from any parallel layout: it is read
on one process), a run folder (its newest checkpoint), or a Hugging Face folder (e.g. a
run's ``export/hf``). Greedy by default; ``--temperature`` above 0 samples, optionally among
the ``--top-k`` most likely tokens, reproducibly for one ``--seed``. The prompt and its
continuation go to stdout, what was loaded and how to stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from ..errors import ConfigError
from ..models.sampling import Sampling, sample, takes_cache
from .model_source import add_model_source_arguments, load_model_source
from .tool_main import parse_and_run

PROG = "titan-generate"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Sample a continuation of a prompt from a titan checkpoint "
                                                      "or a Hugging Face folder (greedy by default).")
    add_model_source_arguments(p)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to add at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, the most likely token each time; above 0: sample, hotter is more random")
    p.add_argument("--top-k", type=int, default=None, help="with --temperature: sample among the k most likely tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    return p


def check_settings(args: argparse.Namespace) -> None:
    """Every flag's value, before anything is loaded."""
    if args.max_new_tokens <= 0:
        raise ConfigError(f"--max-new-tokens must be a positive number of tokens, got {args.max_new_tokens}.")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ConfigError(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}.")
    if args.top_k is not None and args.top_k <= 0:
        raise ConfigError(f"--top-k must be a positive number of tokens, got {args.top_k}; leave it out to sample "
                          f"from every token.")
    if not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed must be a whole number from 0 to 2**63-1 (torch's generator takes no more), got "
                          f"{args.seed}.")
    if args.top_k is not None and args.temperature == 0:
        raise ConfigError("--top-k applies to sampling; add --temperature above 0 (e.g. 0.8), or leave --top-k out "
                          "for greedy output.")


def check_prompt(prompt: str) -> None:
    """A prompt that is not UTF-8 text (its bytes, as the command line or ``main`` gave them): the tokenizers
    would turn the bad bytes into replacement characters and continue a text nobody wrote."""
    first = next((i for i, ch in enumerate(prompt) if "\ud800" <= ch <= "\udfff"), None)
    if first is None:
        return
    offset = len(prompt[:first].encode("utf-8"))
    char = prompt[first]
    # Python holds a byte that is not UTF-8 on the command line as U+DC80..U+DCFF (surrogateescape).
    what = f"byte 0x{ord(char) - 0xDC00:02x}" if "\udc80" <= char <= "\udcff" else f"lone surrogate U+{ord(char):04X}"
    raise ConfigError(f"--prompt is not UTF-8 text: at byte offset {offset} (counting from 0) it holds {what}, "
                      f"which UTF-8 does not allow there; give the prompt as UTF-8 (e.g. convert it with iconv -t "
                      f"UTF-8).")


def generate(args: argparse.Namespace) -> int:
    check_settings(args)
    check_prompt(args.prompt)
    loaded = load_model_source(args, prog=PROG)
    whole, model = loaded.whole, loaded.model
    prompt = whole.tokenizer.encode(args.prompt, bos=True)
    new_tokens = args.max_new_tokens
    limit = getattr(whole.model_args, "max_seq_len", None)
    if isinstance(limit, int):
        if len(prompt) >= limit:
            raise ConfigError(f"the prompt is {len(prompt)} tokens but the model reads at most {limit} positions "
                              f"(its max_seq_len), leaving no room for a new token; shorten the prompt.")
        if len(prompt) + new_tokens > limit:
            new_tokens = limit - len(prompt)
            print(f"[{PROG}] only {new_tokens} new tokens fit in the model's {limit} positions (max_seq_len)",
                  file=sys.stderr)
    cached = takes_cache(model)
    how = "greedy" if args.temperature == 0 else (
        f"sampled at temperature {args.temperature}" + (f", top-k {args.top_k}" if args.top_k else "")
        + f", seed {args.seed}")
    speed = "with a KV cache" if cached else (
        "without a KV cache: the model's forward takes no cache argument, so every new token recomputes the "
        "whole prefix (slower; see docs/seeing-a-run.md)")
    print(f"[{PROG}] {loaded.describe()}: up to {new_tokens} new tokens, {how}, {speed}", file=sys.stderr, flush=True)
    settings = Sampling(max_new_tokens=new_tokens, temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    new = sample(model, prompt, settings, eos_id=whole.tokenizer.eos_id, use_cache=cached)
    if new and new[-1] == whole.tokenizer.eos_id:
        new = new[:-1]  # the end-of-document token is not text
    print(args.prompt + whole.tokenizer.decode(new), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return parse_and_run(PROG, build_parser(), generate, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
