"""A task's examples as token sequences to score: each a context and the target tokens whose
log-likelihood given the context is summed.

Multiple choice: the context is ``encode(context, bos=True)``, each choice's targets
``encode(choice)``, tokenized apart so every choice is scored after the same context tokens.
Perplexity: ``encode(text, bos=True)``, cut into windows of ``window`` predicted tokens; each
window is scored on its own (its first input is the token before it), so a document longer than
the model's context costs no more than one forward per window.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..plugin.spec_factories import Tokenizer
from .tasks import Document, MultipleChoice, Task


@dataclass(frozen=True)
class Request:
    context: tuple[int, ...]  # at least one token (the BOS)
    targets: tuple[int, ...]  # at least one token

    def tokens(self, window: int) -> tuple[int, ...]:
        """The inputs of the forward: context then targets but the last, the oldest context dropped to fit."""
        whole = (self.context + self.targets)[:-1]
        return whole[-window:]


def task_requests(task: Task, tokenizer: Tokenizer, *, window: int) -> list[Request]:
    """The requests of ``task``, in example order (a multiple-choice example gives one per choice)."""
    out: list[Request] = []
    for example in task.examples:
        if isinstance(example, MultipleChoice):
            context = tuple(tokenizer.encode(example.context, bos=True))
            for i, choice in enumerate(example.choices):
                targets = tuple(tokenizer.encode(choice))
                if not targets:
                    raise ConfigError(f"{task.path}:{example.line}: choice {i} ({choice!r}) encodes to no token; give "
                                      f"it some text.")
                if len(targets) > window:
                    raise ConfigError(f"{task.path}:{example.line}: choice {i} is {len(targets)} tokens, more than the "
                                      f"{window} the model reads at once; shorten it.")
                out.append(Request(context, targets))
        else:
            out.extend(document_windows(example, tokenizer, window=window))
    return out


def document_windows(document: Document, tokenizer: Tokenizer, *, window: int) -> list[Request]:
    tokens = tuple(tokenizer.encode(document.text, bos=True))
    return [Request(tokens[start:start + 1], tokens[start + 1:start + 1 + window])
            for start in range(0, len(tokens) - 1, window)]
