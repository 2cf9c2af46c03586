"""A plugin's name is also its config section (``[NAME]``, ``--NAME.KEY=VALUE``): it must not be a core section's.

A converter called ``training`` (or a spec called ``optimizer``) would replace the core's
section of that name in the run's config model: the core's own settings would stop
validating, or be read from the plugin's model. Such a plugin is refused when it loads
(``titan-train``, ``--list``, ``titan-plugin check``) and ``titan-plugin new`` does not
write one.
"""

from __future__ import annotations

from ..config.job import CORE_SECTIONS
from ..errors import PluginError

__all__ = ["core_section_names", "refuse_core_section_name"]


def core_section_names() -> tuple[str, ...]:
    return CORE_SECTIONS


def refuse_core_section_name(name: str, *, who: str, fix: str) -> None:
    """PluginError when ``name`` is a core section's; ``who`` names the plugin (and its distribution)."""
    if name in core_section_names():
        raise PluginError(
            f'{who} is named "{name}", which is also the name of a core config section ([{name}]); a plugin\'s '
            f"name is its config section, so it would shadow the core's settings. {fix} Reserved names: "
            f"{', '.join(core_section_names())}."
        )
