"""Where the shared real traces live (beside the checkout, as on developer machines and in CI)."""

import os
from pathlib import Path

import pytest

# ``../shared`` beside the checkout; SPECTRACE_SHARED names another place (a git worktree one folder deeper)
SHARED = Path(os.environ.get("SPECTRACE_SHARED") or Path(__file__).resolve().parents[3] / "shared")
TRACES = SHARED / "traces"
PROBE = TRACES / "tp2_probe_node.sqlite"
PROBE_STATS = TRACES / "tp2_probe_node.nsys-stats"
EXTERNAL = TRACES / "external"


def need(path: Path) -> Path:
    if not path.exists():
        # one reason for every such test, so that `pytest -rs` (make test) lists them on one line
        pytest.skip(f"needs the shared real traces in {SHARED}/ (beside the checkout, not bundled: docs/cli.md)")
    return path


TP2 = Path(__file__).parents[1] / "data" / "h200_tp2"


def tp2(name: str, dest: Path) -> Path:
    """Bundled TP=2 capture ``name`` (tests/data/h200_tp2) decompressed into ``dest``, with its manifest."""
    import lzma
    import shutil

    out = dest / f"{name}.sqlite"
    if not out.exists():
        with lzma.open(TP2 / f"{name}.sqlite.xz") as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
        man = TP2 / f"{name}.manifest.json"
        if man.exists():
            shutil.copyfile(man, dest / man.name)
    return out
