"""``titan-train --list``: installed specs and converters, their distributions, health."""

from __future__ import annotations

from ..plugin import discovery


def print_plugin_list(*, with_traceback: bool = False) -> int:
    for group, title in ((discovery.SPECS, "train specs"), (discovery.CONVERTERS, "model converters")):
        print(f"{title} ({group}):")
        found = discovery.discover(group)
        if not found:
            print("  (none installed)")
        for name in sorted(found):
            claims = found[name]
            if len(claims) > 1:
                who = ", ".join(f"{c.distribution} {c.version}" for c in claims)
                print(f"  {name:<12} CLASH: claimed by {who}")
                continue
            h = discovery.health(claims[0], with_traceback=with_traceback)
            info = h.info
            if h.error is not None:
                print(f"  {name:<12} {info.distribution} {info.version}  BROKEN: {h.error}")
                continue
            obj = discovery.load_train_spec(name) if group == discovery.SPECS else discovery.load_converter(name)
            tag = "  [prototype]" if getattr(obj, "prototype", False) else ""
            print(f"  {name:<12} {info.distribution} {info.version}  (plugin API {h.api_version}){tag}")
    return 0
