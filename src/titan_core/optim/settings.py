"""Settings torch's optimizer or LR scheduler constructors refuse: a config error naming the section.

The config layer already refuses the values known to break torch (betas outside
[0, 1), eps <= 0, numbers outside float32/int64: see config/finite.py); this is the
net for whatever a torch release checks beyond those. A constructor of the core's own
optimizer or scheduler that raises means the section's values were refused, so the
message names the section and its values instead of showing torch's traceback. A
spec's own ``build_optimizers_fn``/``build_lr_schedulers_fn`` is plugin code and is
named as such (plugin_calls.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pydantic import BaseModel

from ..errors import ConfigError, TitanError

__all__ = ["settings_checked"]


@contextlib.contextmanager
def settings_checked(section: str, values: BaseModel, *, what: str) -> Iterator[None]:
    """Re-raise ValueError/TypeError/RuntimeError/OverflowError from the block as a ConfigError about [section]."""
    try:
        yield
    except TitanError:
        raise
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in values.model_dump(mode="json").items())
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"[{section}] {what} refused these settings ({shown}): {first}. Fix the [{section}] values "
            f"(titan-train --schema lists their ranges)."
        ) from exc
