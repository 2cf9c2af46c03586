"""The path a titan checkpoint's weights take into a whole model (``titan-convert to-hf``'s load):
every file of ``titan_core`` that runs, in order, and how often a call climbs back up a layer of the
import contract (a call from a file in a lower layer into a file in a higher one).

    python scripts/call_path.py RUN_DIR/checkpoints/step-N     # prints the files and the climbs

Needs the package installed (it runs the real load under ``sys.setprofile``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import ROOT, contract_layers, layer_of  # noqa: E402


def module_of(filename: str, package_dir: str) -> str | None:
    if not filename.startswith(package_dir):
        return None
    rel = Path(filename).relative_to(Path(package_dir).parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def main() -> int:
    import titan_core
    from titan_core.train.whole_model import load_titan_checkpoint

    checkpoint = Path(sys.argv[1])
    package_dir = str(Path(titan_core.__file__).parent)
    layers = contract_layers()
    files: list[str] = []
    climbs: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        callee = module_of(frame.f_code.co_filename, package_dir)
        caller_frame = frame.f_back
        caller = module_of(caller_frame.f_code.co_filename, package_dir) if caller_frame else None
        if callee is None:
            return
        if callee not in files:
            files.append(callee)
        if caller is not None and caller != callee:
            lc, le = layer_of(caller, layers), layer_of(callee, layers)
            if lc is not None and le is not None and le < lc:
                climbs.append(f"{caller} -> {callee}")

    sys.setprofile(profile)
    try:
        load_titan_checkpoint(checkpoint)
    finally:
        sys.setprofile(None)
    print(f"files of titan_core that ran: {len(files)}")
    for name in files:
        print(f"  {name}")
    distinct = sorted(set(climbs))
    print(f"calls climbing back up a layer: {len(climbs)} ({len(distinct)} distinct)")
    for edge in distinct:
        print(f"  {edge}")
    _ = ROOT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
