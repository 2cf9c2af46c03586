"""Each task's figures from its scores, as metrics records name them (``eval/<task>/<figure>``).

Multiple choice: ``acc`` (the choice of highest log-likelihood is the gold one) and ``acc_norm``
(the log-likelihood divided by the choice's length in UTF-8 bytes, so long choices are not
penalised for their length; lm-eval's acc_norm, which counts characters: the same for ASCII).
Perplexity: ``nll`` (mean negative log-likelihood per predicted token) and ``ppl`` = exp(nll).
Ties go to the first choice. ``examples`` counts what was scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..plugin.spec_factories import Tokenizer
from .requests import Request, task_requests
from .scoring import ONE_PROCESS, Forward, ScoreLayout, Scores, score_requests
from .tasks import MultipleChoice, Task


def _first_max(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


def task_results(task: Task, scores: Scores, targets: list[int]) -> dict[str, float]:
    """The figures of one task from its requests' scores (``targets``: each request's number of targets)."""
    prefix = f"eval/{task.name}/"
    if task.kind == "perplexity":
        nll = -sum(scores.loglikelihood) / sum(targets)
        return {prefix + "nll": nll, prefix + "ppl": math.exp(min(nll, 700.0)), prefix + "examples": len(task.examples)}
    right = right_norm = 0
    start = 0
    for example in task.examples:
        assert isinstance(example, MultipleChoice)
        lls = scores.loglikelihood[start:start + len(example.choices)]
        start += len(example.choices)
        normed = [ll / len(choice.encode("utf-8")) for ll, choice in zip(lls, example.choices)]
        right += _first_max(lls) == example.gold
        right_norm += _first_max(normed) == example.gold
    n = len(task.examples)
    return {prefix + "acc": right / n, prefix + "acc_norm": right_norm / n, prefix + "examples": n}


@dataclass(frozen=True)
class PreparedTask:
    """A task and its requests, tokenized once (at start-up: a choice too long is refused there)."""

    task: Task
    requests: list[Request]
    pad_id: int


def prepare_tasks(tasks: list[Task], tokenizer: Tokenizer, *, window: int) -> list[PreparedTask]:
    return [PreparedTask(task, task_requests(task, tokenizer, window=window), tokenizer.eos_id) for task in tasks]


def score_task(prepared: PreparedTask, forward: Forward, *, window: int, batch_size: int, device: torch.device,
               layout: ScoreLayout = ONE_PROCESS) -> Scores:
    return score_requests(prepared.requests, forward, window=window, batch_size=batch_size, device=device,
                          pad_id=prepared.pad_id, layout=layout)


def evaluate(tasks: list[PreparedTask], forward: Forward, *, window: int, batch_size: int, device: torch.device,
             layout: ScoreLayout = ONE_PROCESS) -> dict[str, float]:
    """Every task's figures, the same on every rank. Call it with the model in eval mode, under no_grad."""
    results: dict[str, float] = {}
    for prepared in tasks:
        scores = score_task(prepared, forward, window=window, batch_size=batch_size, device=device, layout=layout)
        results.update(task_results(prepared.task, scores, [len(r.targets) for r in prepared.requests]))
    return results


def format_results(results: dict[str, float]) -> str:
    """One line: each task's figures (examples counts left out)."""
    parts = []
    for key, value in results.items():
        if key.endswith("/examples"):
            continue
        parts.append(f"{key.removeprefix('eval/')} {value:.4f}")
    return " | ".join(parts)
