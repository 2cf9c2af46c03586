"""The device a planned run will use: a known accelerator by name, or a memory size.

``titan-train --dry-run --target-device H100`` (or ``--target-device 80GiB``) plans a
layout for that device from any machine. The figures are the memory torch reports on
each device (``torch.cuda.get_device_properties(...).total_memory``), not the marketing
figure: an "80 GB" H100 shows 79.1 GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

GIB = 2**30


@dataclass(frozen=True)
class TargetDevice:
    name: str
    memory_bytes: int
    #: a real accelerator (CUDA context and communication buffers come on top of the model)
    accelerator: bool = True

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


# Total memory as torch reports it, in GiB.
KNOWN_DEVICES: dict[str, float] = {
    "A100-40GB": 39.4,
    "A100-80GB": 79.1,
    "H100": 79.1,  # the SXM and PCIe 80 GB parts
    "H100-94GB": 93.1,  # H100 NVL
    "H200": 139.8,
    "B200": 178.4,
    "GH200": 94.5,
    "L4": 22.0,
    "L40S": 44.4,
    "A10G": 22.0,
    "MI250X": 63.98,
    "MI300X": 191.98,
}
_ALIASES = {"A100": "A100-80GB", "H100-80GB": "H100", "H100-SXM": "H100", "H100-NVL": "H100-94GB"}
# A sign and an exponent are read too, so that "-5GiB" or "1e400GiB" is refused as a size, not as a device name
_SIZE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)\s*(GiB|GB|G)\s*$", re.IGNORECASE)
#: No accelerator holds a pebibyte: a size above it is a typo (an exponent, extra digits)
_MAX_DEVICE_BYTES = 2**50
#: Nor less than a mebibyte: a size below it is a typo too (1e-10GiB was 0 bytes, and the plan divided by it)
_MIN_DEVICE_BYTES = 2**20


def parse_target_device(text: str) -> TargetDevice:
    """``H100``, ``h200``, ``80GiB``, ``141GB``; ConfigError listing the known names otherwise."""
    size = _SIZE.match(text)
    if size:
        value, unit = float(size.group(1)), size.group(2).lower()
        scaled = value * (GIB if unit in ("gib", "g") else 10**9)
        if not scaled > 0:
            raise ConfigError(f"--target-device {text}: the memory size must be above 0.")
        if scaled > _MAX_DEVICE_BYTES:
            raise ConfigError(f"--target-device {text}: more memory than any accelerator has (over 1 PiB); give "
                              f"the memory of one device, e.g. --target-device 80GiB.")
        if scaled < _MIN_DEVICE_BYTES:
            raise ConfigError(f"--target-device {text}: less memory than any accelerator has (under 1 MiB); give "
                              f"the memory of one device, e.g. --target-device 80GiB.")
        n_bytes = int(scaled)
        return TargetDevice(f"{value:g} {size.group(2)} device", n_bytes)
    by_lower = {name.lower(): name for name in (*KNOWN_DEVICES, *_ALIASES)}
    name = by_lower.get(text.strip().lower())
    if name is None:
        known = ", ".join(KNOWN_DEVICES)
        raise ConfigError(f'--target-device "{text}" is not a known device. Known: {known}; or give the memory '
                          f"of one device, e.g. --target-device 80GiB.")
    name = _ALIASES.get(name, name)
    return TargetDevice(name, int(KNOWN_DEVICES[name] * GIB))
