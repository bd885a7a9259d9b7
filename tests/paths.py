"""Where the shared real traces live (beside the checkout, as on developer machines and in CI)."""

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "traces"
PROBE = TRACES / "tp2_probe_node.sqlite"
PROBE_STATS = TRACES / "tp2_probe_node.nsys-stats"
EXTERNAL = TRACES / "external"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present (the shared traces live beside the checkout)")
    return path
