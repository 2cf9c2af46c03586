"""User-facing errors: one clear paragraph, exit code 2, no traceback by default."""

from __future__ import annotations


class TitanError(Exception):
    """An error caused by the user's input or environment, not by a bug.

    The CLI prints only the message (one paragraph naming what is wrong and how
    to fix it) and exits with ``exit_code``; ``--traceback`` shows the stack.
    """

    exit_code: int = 2


class ConfigError(TitanError):
    """The merged job configuration is invalid."""


class PluginError(TitanError):
    """A plugin could not be found, imported, or is incompatible."""


class CheckpointError(TitanError):
    """A checkpoint cannot be saved or loaded safely."""


class NonFiniteError(TitanError):
    """Training produced a non-finite loss or gradient norm."""

    exit_code = 3


def did_you_mean(word: str, choices: list[str] | tuple[str, ...] | set[str]) -> str:
    """Return ' Did you mean "x"?' for the closest choice, or '' when none is close."""
    import difflib

    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f' Did you mean "{close[0]}"?' if close else ""
