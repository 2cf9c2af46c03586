"""Test-only hooks: replay a failure's membership without the failure; hold a run while a group is down.

``TITAN_FT_TEST_ABSENT="1:11-14,2:20-20"`` makes replica 1 sit out steps 11..14 and replica 2
step 20 of an unfailed run: every group still reads its share of those steps, but an absent
group's gradients and loss count as zero and the live groups' average is taken over the others
only, as torchft's would be without that group. The losses of such a run are what a run that
really lost those groups must commit (tests/test_fault_tolerance.py compares them). It is read
from the environment, not the config, because it is no setting a user should ever touch.
"""

from __future__ import annotations

import math
import os
import re

from ..errors import ConfigError

ABSENT_ENV = "TITAN_FT_TEST_ABSENT"
# Seconds each step waits while fewer than all groups train: a test's survivors cannot finish the run
# before a restarted group (slow to start on a loaded machine) is back, and leave it the CPU meanwhile.
SHORT_STEP_ENV = "TITAN_FT_TEST_SHORT_STEP_S"
_WINDOW = re.compile(r"(\d+):(\d+)-(\d+)")


_MAX_WINDOW = 1_000_000  # steps in one window: a typo of many digits is refused, not looped over


def absent_windows(value: str | None = None) -> dict[int, set[int]]:
    """step -> the replica ids absent in it (empty when the variable is unset)."""
    value = os.environ.get(ABSENT_ENV, "") if value is None else value
    absent: dict[int, set[int]] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        match = _WINDOW.fullmatch(item)
        if match is None:
            raise ConfigError(f"{ABSENT_ENV}={value!r}: {item!r} is not REPLICA:FIRST-LAST (e.g. 1:11-14); this "
                              "test-only variable must be unset in real runs.")
        replica, first, last = (int(g) for g in match.groups())
        if not 1 <= first <= last or last - first > _MAX_WINDOW:
            raise ConfigError(f"{ABSENT_ENV}={value!r}: {item!r} needs 1 <= FIRST <= LAST and at most {_MAX_WINDOW} "
                              "steps; this test-only variable must be unset in real runs.")
        for step in range(first, last + 1):
            absent.setdefault(step, set()).add(replica)
    return absent


def short_step_seconds() -> float:
    value = os.environ.get(SHORT_STEP_ENV, "")
    try:
        seconds = float(value) if value else 0.0
    except ValueError:
        seconds = math.nan
    if not 0.0 <= seconds <= 60.0:  # NaN fails this too; an infinite wait would hang the survivors
        raise ConfigError(f"{SHORT_STEP_ENV}={value!r} is not a number of seconds from 0 to 60; this test-only "
                          "variable must be unset in real runs.")
    return seconds
