"""Evaluation on tasks (docs/evaluation.md): multiple choice scored by log-likelihood, and perplexity
on held-out documents, from local JSONL files or the built-in tasks shipped in the wheel.

``tasks`` reads and checks task files, ``requests`` turns them into token sequences to score,
``scoring`` runs a model over them (split over data-parallel ranks, summed exactly), and
``results`` turns the scores into each task's figures. ``evaluate`` does all four.

A component: may import ``config``, ``runtime`` and the leaves; independent of the other
components. The model reaches it as a plain forward function.
"""

from __future__ import annotations

from .results import PreparedTask, evaluate, format_results, prepare_tasks
from .scoring import Forward, ScoreLayout
from .tasks import BUILTIN_TASKS, Task, load_tasks

__all__ = ["BUILTIN_TASKS", "Forward", "PreparedTask", "ScoreLayout", "Task", "evaluate", "format_results", "load_tasks",
           "prepare_tasks"]
