"""Real low-precision kernels or emulation: the ``emulate`` setting a converter resolves against the device.

Shared by the float8 and MX converters (``[float8] emulate`` / ``[mx] emulate``): ``true`` emulates,
``false`` demands real kernels (an error where there are none), ``auto`` uses them where the GPU
has them and emulates on CPU, and refuses a GPU too old for them (a silent fallback there would
hide a misconfigured cluster). Only the converter's facts and wording differ (``KernelNeeds``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..console import progress
from ..errors import TitanError
from ..runtime.launch_env import rank_env
from ..runtime.library_noise import kernel_load_note


@dataclass(frozen=True)
class KernelNeeds:
    """What a converter's real kernels need, in the words of its messages."""

    section: str  # the config section: "float8"
    kernels: str  # the kernels' name in messages: "float8", "MXFP8"
    hardware: str  # what they need: "a CUDA GPU with compute capability 8.9 or newer (...)"
    emulated_in: str  # what emulation computes in: "float32"
    min_capability: tuple[int, int]  # the oldest CUDA compute capability that has them
    too_old: str  # the error on an older GPU; ``{major}`` and ``{minor}`` are its capability


_said: set[str] = set()


def new_run_notes() -> None:
    """Forget what was said: the next run resolved in this process says it again."""
    _said.clear()


def _say_once(needs: KernelNeeds, message: str) -> None:
    """One line per converter section and process, from rank 0: emulation is a choice a user should see."""
    if needs.section in _said:
        return
    _said.add(needs.section)
    progress(message, is_rank0=rank_env()[0] == 0)


def resolve_emulation(emulate: bool | str, device: torch.device, needs: KernelNeeds,
                      cuda_capability: Callable[[torch.device], tuple[int, int]]) -> tuple[bool, str]:
    """(emulate?, why). Raises TitanError when real kernels are asked for but cannot run."""
    if emulate is True:
        return True, f"{needs.section}.emulate=true"
    if device.type != "cuda":
        if emulate is False:
            raise TitanError(
                f"{needs.section}.emulate=false asks for real {needs.kernels} kernels, which need {needs.hardware}, "
                f"but this run uses device {device.type}. Set --{needs.section}.emulate=auto (or true) to emulate "
                f"{needs.kernels} matmuls in {needs.emulated_in} (slow; for testing)."
            )
        _say_once(needs, f"{needs.section}: {needs.kernels} matmuls are emulated in {needs.emulated_in} on "
                         f"{device.type}, which has no {needs.kernels} kernels: the numerics of {needs.kernels}, at "
                         f"a fraction of float32's speed (about 20x slower on CPU); real kernels need {needs.hardware}.")
        return True, f"emulated: no {needs.kernels} kernels on {device.type}"
    major, minor = cuda_capability(device)
    if (major, minor) >= needs.min_capability:
        note = kernel_load_note()
        if note is not None:
            _say_once(needs, f"{needs.section}: real {needs.kernels} kernels on sm_{major}{minor}; {note}")
        return False, f"real {needs.kernels} kernels on sm_{major}{minor}"
    raise TitanError(needs.too_old.format(major=major, minor=minor))
