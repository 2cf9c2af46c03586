"""Print the core config reference (one table per section) from the pydantic models.

docs/configuration.md embeds this output between markers; tests/test_docs.py checks
that the embedded copy is current, so the reference cannot drift from the code.

    python scripts/gen_config_reference.py > /tmp/ref.md
"""

from __future__ import annotations

import json

from titan_core.config.job import JobConfig


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if hasattr(value, "model_dump"):
        return ""
    return json.dumps(value) if value is not None else "(unset)"


def reference() -> str:
    out: list[str] = []
    for section, field in JobConfig.model_fields.items():
        model = field.annotation
        out.append(f"### [{section}]\n")
        out.append(f"{field.description}\n")
        out.append("| key | default | description |")
        out.append("|---|---|---|")
        for key, sub in model.model_fields.items():  # type: ignore[union-attr]
            out.append(f"| `{key}` | `{_default(sub)}` | {sub.description} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(reference())
