"""The compare's report: the document (Markdown and self-contained HTML), its figures and the
advice drawn from the measurements, plus `runner.py report`.

The names below are what the other jobs use; the rest is this package's own.
"""

from harness.common.lazy_exports import lazy_exports

_EXPORTS = {"build_report": "report_cli"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
