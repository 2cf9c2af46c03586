"""Run titan-core's conformance checks on this converter (what `titan-plugin check compat_conv` runs)."""

from titan_core.testing import ConverterConformance


class TestCompatConv(ConverterConformance):
    converter = "compat_conv"
    fast = True  # the quick subset; set False (or run `titan-plugin check compat_conv`) for every check
