"""The oldest torch titan-core runs on, checked when ``titan_core`` is imported.

Read without importing torch (``titan-train --help`` and ``--list`` never pay for it): from the
already imported module when there is one, else from ``torch/version.py`` found on the path. A
torch below the floor ends the process with one message and exit 2, before anything fails
deep inside torch with a traceback about a missing private name. The private and recent torch
APIs this floor covers are listed, each with a fallback or a refusal, in ``torch_compat``.
"""

from __future__ import annotations

import re
import sys

#: The oldest torch the project runs on (the GPU image's 2.11.0); pyproject.toml says the same.
TORCH_FLOOR = (2, 11)
#: The newest torch the fast tier has passed on (scripts/setup.sh installs it).
TORCH_TESTED_UP_TO = (2, 13)
# Exit code of a refused torch: bad environment, as errors.CONFIG_EXIT (not imported: this runs first).
_EXIT = 2


def version_tuple(text: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: ``2.11.0+cu130`` -> (2, 11), ``2.12.0a0+git1`` -> (2, 12)."""
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def floor_text() -> str:
    return ".".join(map(str, TORCH_FLOOR))


def installed_torch_version() -> str | None:
    """The version of the torch this process would import, or None when there is none."""
    module = sys.modules.get("torch")
    if module is not None:
        return str(getattr(module, "__version__", "0"))
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    from pathlib import Path

    for folder in spec.submodule_search_locations:
        try:
            lines = (Path(folder) / "version.py").read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("'\"")
    return "0"  # a torch without version.py: far older than anything this project knows


def require_torch_floor() -> None:
    """Exit 2 with a message naming the floor if this Python's torch is missing or too old."""
    version = installed_torch_version()
    fix = f"install a supported one: pip install 'torch>={floor_text()}'"
    if version is None:
        message = f"titan-core needs torch >= {floor_text()}; this Python ({sys.executable}) has no torch: {fix}"
    elif version_tuple(version) < TORCH_FLOOR:
        message = (f"titan-core needs torch >= {floor_text()} (tested {floor_text()} to "
                   f"{'.'.join(map(str, TORCH_TESTED_UP_TO))}); this Python ({sys.executable}) has torch "
                   f"{version}: {fix}")
    else:
        return
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(_EXIT)
