"""NVTX phase ranges for SGLang EAGLE-3, injected at import time.

Importing this package is cheap: it loads neither nvtx, torch nor SGLang.
"""

from .phases import DOMAIN, NAMES, PHASES, Phase

__all__ = ["DOMAIN", "NAMES", "PHASES", "Phase"]
