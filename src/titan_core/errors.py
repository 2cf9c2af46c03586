"""Every error the core raises on purpose, and the exit code each one ends the process with.

A ``TitanError`` is one clear paragraph: the CLI prints its message (no traceback; ``--traceback``
shows it) and exits ``exit_code``. The two ``BaseException`` subclasses at the end are control
flow that no ``except Exception`` in plugin or library code may swallow.
"""

from __future__ import annotations

import os

__all__ = [
    "CONFIG_EXIT",
    "GAVE_UP_EXIT",
    "LIGHTHOUSE_LOST_EXIT",
    "NON_FINITE_EXIT",
    "PEER_LOST_EXIT",
    "CheckpointError",
    "ConfigError",
    "CoreErrorInPluginCall",
    "DeadlinePassed",
    "LighthouseLost",
    "NonFiniteError",
    "NothingToRejoin",
    "OutOfMemory",
    "PeerLost",
    "PluginError",
    "PluginHang",
    "PluginOutOfMemory",
    "RendezvousError",
    "RunFolderBusy",
    "StopRequested",
    "Terminated",
    "TitanError",
    "did_you_mean",
]

# Exit codes (docs/fault-tolerance.md and docs/distributed.md name them). A run stopped by a signal
# exits 128 + the signal's number, as a shell reports it.
CONFIG_EXIT = 2  # bad input: a setting, a file, a plugin, the environment
NON_FINITE_EXIT = 3  # the loss or the gradient norm stopped being finite
# A worker whose collective failed because another rank died or stopped answering; under the
# --nproc-per-node launcher it prints nothing, so the launcher's message is the only one.
PEER_LOST_EXIT = 4
LIGHTHOUSE_LOST_EXIT = 5  # a replica group that lost (or never reached) the fault-tolerance lighthouse
GAVE_UP_EXIT = 6  # the fault-tolerance supervisor stopped restarting replica groups


class TitanError(Exception):
    """An error caused by the user's input or environment, not by a bug.

    The CLI prints only the message (one paragraph naming what is wrong and how
    to fix it) and exits with ``exit_code``; ``--traceback`` shows the stack.
    """

    exit_code: int = CONFIG_EXIT


class ConfigError(TitanError):
    """The merged job configuration is invalid."""


class PluginError(TitanError):
    """A plugin could not be found, imported, or is incompatible, or its code failed (plugin_boundary.py)."""


class PluginHang(PluginError):
    """A call into a plugin did not return within its deadline (``model.plugin_timeout_s``)."""

    def __init__(self, message: str, *, method: str, seconds: float) -> None:
        super().__init__(message)
        self.method, self.seconds = method, seconds


class CoreErrorInPluginCall(TitanError):
    """titan-core's own code raised while a plugin's method ran (a core helper the plugin called, such as the
    shared Hugging Face renames); ``__cause__`` is the original exception."""


class CheckpointError(TitanError):
    """A checkpoint cannot be saved or loaded safely."""


class NonFiniteError(TitanError):
    """Training produced a non-finite loss or gradient norm."""

    exit_code = NON_FINITE_EXIT


class OutOfMemory(TitanError):
    """An allocation failed during the run; the user's fix is a smaller per-rank shape."""

    def __init__(self, message: str, *, where: str, original: BaseException) -> None:
        super().__init__(message)
        self.where = where
        self.original = original


class PluginOutOfMemory(OutOfMemory):
    """Named by the plugin method it happened in; ``out_of_memory_named`` adds the step or phase."""


class PeerLost(TitanError):
    """Another rank died or stopped answering."""

    exit_code = PEER_LOST_EXIT

    def __init__(self, message: str, *, quiet: bool) -> None:
        super().__init__(message)
        self.quiet = quiet


class RunFolderBusy(TitanError):
    """Another live run holds the run folder's lock."""


class RendezvousError(TitanError):
    """The processes of a run could not all meet."""


class LighthouseLost(TitanError):
    """A fault-tolerant replica group lost its lighthouse."""

    exit_code = LIGHTHOUSE_LOST_EXIT

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.quiet = bool(os.environ.get("TITAN_FT_SUPERVISED"))  # the local supervisor prints one message for all


class NothingToRejoin(TitanError):
    """A restarted replica group came up after the other groups had finished: there is no run left to
    rejoin (training on alone would redo the run from this group's last state). Not an error: exit 0."""

    exit_code = 0
    quiet = True


class StopRequested(TitanError):
    """The run stopped on a signal; the CLI prints the message as is (no "error:") and exits ``exit_code``."""

    def __init__(self, message: str, *, signum: int, quiet: bool = False) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
        self.quiet = quiet


class Terminated(BaseException):
    """SIGTERM in a tool that has no step boundary to stop at (titan-plugin, titan-convert). A BaseException,
    like KeyboardInterrupt, so that no ``except Exception`` swallows it and ``subprocess.run`` kills its child."""


class DeadlinePassed(BaseException):
    """Raised inside a call that outlived its deadline (a BaseException: ``except Exception`` in the
    stuck code does not swallow it)."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"{what} did not return within {seconds:g} s")
        self.what, self.seconds = what, seconds


def did_you_mean(word: str, choices: list[str] | tuple[str, ...] | set[str]) -> str:
    """Return ' Did you mean "x"?' for the closest choice, or '' when none is close."""
    import difflib

    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f' Did you mean "{close[0]}"?' if close else ""
