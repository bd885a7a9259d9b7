"""Capturing a trace: the nsys wrapper (``spectrace trace``), its manifest, the embedded EAGLE-shaped
workload, the SGLang server driver and a stand-in server, the scrubber, and the bundled samples.

Runs on GPU hosts without the analysis stack (``python -m nvtx_hooks.capture trace|scrub|demo-workload``);
never imports :mod:`analyze`. Expected failures raise :class:`CaptureError` (one line, exit 2).
"""

__all__ = ["CaptureError"]


class CaptureError(Exception):
    """A capture cannot run as asked; ``str(e)`` says what is wrong and what to do."""
