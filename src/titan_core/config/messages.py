"""Turn pydantic's ValidationError into one readable paragraph per problem."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import did_you_mean


def _section_fields(job_model: type[BaseModel], section: str) -> list[str]:
    field = job_model.model_fields.get(section)
    ann = getattr(field, "annotation", None)
    return list(getattr(ann, "model_fields", {}))


def describe(exc: ValidationError, job_model: type[BaseModel]) -> str:
    """'unknown key "training.stpes". Did you mean "steps"?' and friends, one line each."""
    lines: list[str] = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        where = ".".join(loc) or "config"
        got: Any = err.get("input")
        if err["type"] == "extra_forbidden":
            if len(loc) == 1:
                hint = did_you_mean(loc[0], list(job_model.model_fields))
                lines.append(f'unknown section "{loc[0]}".{hint} Known sections: {", ".join(job_model.model_fields)}.')
            else:
                hint = did_you_mean(loc[-1], _section_fields(job_model, loc[0]))
                known = ", ".join(_section_fields(job_model, loc[0]))
                lines.append(f'unknown key "{where}".{hint} Keys of [{loc[0]}]: {known}.')
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            lines.append(f"{where}: {msg} (got {got!r})." if "input" in err and len(loc) > 1 else f"{where}: {msg}.")
    return "invalid configuration:\n  " + "\n  ".join(lines)
