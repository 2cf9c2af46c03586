"""Run titan-core's conformance checks on this spec (what `titan-plugin check compat_spec` runs)."""

from titan_core.testing import TrainSpecConformance


class TestCompatSpec(TrainSpecConformance):
    train_spec = "compat_spec"
    fast = True  # the quick subset; set False (or run `titan-plugin check compat_spec`) for every check
