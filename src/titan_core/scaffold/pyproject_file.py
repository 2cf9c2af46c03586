"""What every package ``titan-plugin new`` writes shares: its pyproject.toml, given its entry point."""


def pyproject(*, kind: str, group: str, target: str, comment: str) -> str:
    """pyproject.toml of a ``kind`` plugin ("converter", "model") whose entry point in ``group`` names ``target``."""
    what = "converter $name" if kind == "converter" else "spec $name"
    return f'''[build-system]
requires = ["hatchling>=1.18"]
build-backend = "hatchling.build"

[project]
name = "$dist"
version = "0.1.0"
description = "A titan-core {kind} plugin ({what})"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["titan-core>=0.1,<0.2", "torch>=2.11"]

[project.optional-dependencies]
test = ["pytest>=8"]

# What makes this a titan-core plugin: {comment}
[project.entry-points."{group}"]
$name = "{target}"

[tool.hatch.build.targets.wheel]
packages = ["src/$pkg"]
'''
