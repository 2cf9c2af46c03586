"""The torch range (2.11 to 2.13): private torch names only in runtime/torch_compat.py, each of them
present on the torch installed here, the floor refused on import, and the same initial weights on
every torch. The fast tier runs this on torch 2.13 (.venv) and 2.11 (scripts/setup_torch211.sh)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from titan_core.errors import ConfigError
from titan_core.runtime import torch_compat as compat
from titan_core.runtime.torch_floor import TORCH_FLOOR, installed_torch_version, version_tuple

from conftest import REPO

COMPAT = REPO / "src/titan_core/runtime/torch_compat.py"
# Private methods of torch objects reached through a variable (no module path to see them by).
PRIVATE_METHODS = {"_flatten", "_unflatten"}


def _is_private(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.endswith("__") for p in parts[1:])


def private_torch_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every private torch name ``source`` imports or reaches through an imported name."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the torch path it stands for
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    bound[alias.asname or "torch"] = alias.name if alias.asname else "torch"
                    if _is_private(alias.name):
                        found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                if _is_private(f"{node.module}.{alias.name}"):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in PRIVATE_METHODS:
            found.append((node.lineno, f".{node.attr}"))
            continue
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in bound and _is_private(".".join([bound[base.id], *reversed(chain)])):
            found.append((node.lineno, ".".join([bound[base.id], *reversed(chain)])))
    return sorted(set(found))


def test_the_scanner_sees_each_way_of_reaching_a_private_name() -> None:
    source = (
        "import torch\nimport torch.distributed as dist\n"
        "from torch.distributed._composable.replicate_with_fsdp import replicate\n"
        "from torch.distributed.checkpoint.filesystem import _StorageInfo\n"
        "y = torch._grouped_mm(a, b)\nz = torch.ops.aten._scaled_mm\nw = dist._functional\n"
        "m = mesh._unflatten('a', (1,), ('b',))\nok = torch.nn.functional.relu(x) + torch.__version__\n"
    )
    names = [name for _, name in private_torch_uses(source)]
    assert names == ["torch.distributed._composable.replicate_with_fsdp.replicate",
                     "torch.distributed.checkpoint.filesystem._StorageInfo", "torch._grouped_mm",
                     "torch.ops.aten._scaled_mm", "torch.distributed._functional", "._unflatten"]


def test_no_file_of_the_core_or_a_plugin_reaches_a_private_torch_name_but_the_compat_module() -> None:
    files = [*(REPO / "src").rglob("*.py"), *(REPO / "plugins").rglob("*.py")]
    assert len(files) > 100
    outside = [f"{path.relative_to(REPO)}:{line}: {name}" for path in files if path != COMPAT
               for line, name in private_torch_uses(path.read_text(encoding="utf-8"))]
    assert outside == [], "private torch names outside runtime/torch_compat.py (add a function there):\n" + \
        "\n".join(outside)
    assert len(private_torch_uses(COMPAT.read_text(encoding="utf-8"))) >= 5  # they are all there instead


def test_compat_and_floor_import_nothing_of_titan_core_but_errors() -> None:
    for name in ("torch_compat", "torch_floor"):
        tree = ast.parse((REPO / f"src/titan_core/runtime/{name}.py").read_text(encoding="utf-8"))
        relative = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
        assert relative <= {"errors", "torch_floor"}, (name, relative)


def test_every_private_name_the_project_uses_is_on_this_torch() -> None:
    """What the fast tier proves on torch 2.11 and 2.13: each name resolves, and the cheap ones run."""
    for module, name in [
        ("torch.distributed._serialization", "_streaming_load"),
        ("torch.distributed.tensor._utils", "compute_local_shape_and_global_offset"),
        ("torch.distributed._shard._utils", "narrow_tensor_by_index"),
        ("torch.distributed.checkpoint._nested_dict", "flatten_state_dict"),
        ("torch.distributed.checkpoint._nested_dict", "unflatten_state_dict"),
        ("torch.distributed.checkpoint._traverse", "set_element"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.distributed.checkpoint.state_dict_loader", "_load_state_dict"),
        ("torch.cuda.memory", "_record_memory_history"),
        ("torch.cuda.memory", "_dump_snapshot"),
        ("torch.utils._pytree", "tree_map"),
    ]:
        assert callable(compat._private(module, name)), (module, name)
    if torch.version.cuda is not None:  # a CUDA build (the GPU image's 2.11.0+cu130)
        assert callable(compat._private("torch._C", "_cuda_attach_out_of_memory_observer"))
    assert callable(compat.replicate_with_fsdp())
    assert isinstance(compat.EmptyStateDictLoadPlanner, type)
    from torch.distributed.device_mesh import DeviceMesh

    assert callable(DeviceMesh._flatten) and callable(DeviceMesh._unflatten)
    assert compat.has_grouped_mm() and compat.grouped_mm_op() is not None
    assert compat.current_graph_task_id() == -1
    # The grouped GEMM on CPU in float32 (16-byte rows): each group's rows times its own matrix.
    x, w = torch.randn(6, 4), torch.randn(2, 4, 8)
    out = compat.grouped_mm(x, w, offs=torch.tensor([2, 6], dtype=torch.int32))
    torch.testing.assert_close(out, torch.cat([x[:2] @ w[0], x[2:] @ w[1]]))
    # ATen's CPU flash attention against the reference formula.
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    got, lse = compat.cpu_flash_attention(q, k, v, causal=True)
    torch.testing.assert_close(got, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert lse.shape == (1, 2, 5)
    nested = {"a": {"b": torch.ones(2)}, "c": [torch.zeros(1)]}
    flat, mappings = compat.flatten_state_dict(nested)
    assert set(flat) == {"a.b", "c.0"} and compat.unflatten_state_dict(flat, mappings)["a"]["b"].tolist() == [1, 1]
    assert compat.tree_map(lambda t: t * 2, nested)["a"]["b"].tolist() == [2, 2]


def test_a_private_name_torch_dropped_is_refused_with_the_versions_that_have_it() -> None:
    with pytest.raises(ConfigError, match=r"needs torch.distributed._gone.name, which torch .* does not have .*"
                                          r"present in torch 2\.11 to 2\.13\): .*pip install 'torch>=2\.11,<=2\.13'"):
        compat._private("torch.distributed._gone", "name")
    with pytest.raises(ConfigError, match=r"DeviceMesh._unflatten"):
        compat.unflatten_mesh(object(), "dp_shard", (1, 1), ("a", "b"))  # type: ignore[arg-type]


def test_trunc_normal_draws_the_same_numbers_on_every_torch() -> None:
    """torch 2.13's trunc_normal_ redraws out-of-bound values, 2.11's inverts the CDF: the same seed gave
    other weights (and loss curves). These are 2.13's numbers, drawn here on whatever torch runs."""
    drawn = compat.trunc_normal_(torch.empty(6), mean=0.0, std=1.0, a=-0.5, b=0.5,
                                 generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(drawn, torch.tensor([-0.146795, 0.240546, 0.138173, 0.13424, 0.317678, 0.132807]),
                               rtol=0, atol=1e-6)
    big = compat.trunc_normal_(torch.empty(4096), mean=1.0, std=0.02, a=0.94, b=1.06,
                               generator=torch.Generator().manual_seed(0))
    assert 0.94 <= big.min() and big.max() <= 1.06 and abs(big.mean().item() - 1.0) < 0.002
    meta = torch.empty(3, device="meta")
    assert compat.trunc_normal_(meta, mean=0.0, std=1.0, a=-2, b=2) is meta


def test_version_strings() -> None:
    assert version_tuple("2.11.0+cu130") == (2, 11)
    assert version_tuple("2.13.0+cpu") == (2, 13)
    assert version_tuple("2.12.0a0+git1234") == (2, 12)
    assert version_tuple("nonsense") == (0, 0)
    assert installed_torch_version() == torch.__version__ and version_tuple(torch.__version__) >= TORCH_FLOOR


def _import_titan_core(code: str, tmp_path: Path, *, python_flags: tuple[str, ...] = (),
                       pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *python_flags, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)


def test_importing_titan_core_on_an_older_torch_names_the_floor_and_exits_2(tmp_path: Path) -> None:
    # An imported torch whose __version__ says 2.10 (a stand-in module: importing the real one costs seconds).
    fake_torch = "import sys, types; sys.modules['torch'] = types.ModuleType('torch'); sys.modules['torch'].__version__"
    proc = _import_titan_core(f"{fake_torch} = '2.10.0+cpu'; import titan_core; print('went on')", tmp_path)
    assert proc.returncode == 2, proc
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert "titan-core needs torch >= 2.11 (tested 2.11 to 2.13); this Python" in proc.stderr
    assert "has torch 2.10.0+cpu: install a supported one: pip install 'torch>=2.11'" in proc.stderr


def test_the_floor_is_read_without_importing_torch(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("print('torch imported')\n")
    (fake / "version.py").write_text("from typing import Optional\n__version__ = '2.9.1'\ncuda: Optional[str] = None\n")
    proc = _import_titan_core("import titan_core", tmp_path, pythonpath=str(tmp_path / "site"))
    assert proc.returncode == 2, proc
    assert "torch imported" not in proc.stdout + proc.stderr
    assert "has torch 2.9.1: install a supported one" in proc.stderr and "Traceback" not in proc.stderr


def test_a_python_without_torch_is_told_so(tmp_path: Path) -> None:
    # -S: no site-packages, so no torch; titan_core from the source tree (its import needs nothing else).
    proc = _import_titan_core("import titan_core", tmp_path, python_flags=("-S",), pythonpath=str(REPO / "src"))
    assert proc.returncode == 2, proc
    assert "has no torch: install a supported one: pip install 'torch>=2.11'" in proc.stderr
