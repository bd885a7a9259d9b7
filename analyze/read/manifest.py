"""The capture's manifest (``NAME.manifest.json`` beside ``NAME.sqlite``, written by ``spectrace trace``): how
the workload ran (its speculative settings, the recorded environment, its own throughput), read once per use.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["manifest_path", "speculative", "read_manifest"]


def manifest_path(report: str | Path) -> Path:
    """``NAME.manifest.json`` beside ``NAME.sqlite``."""
    p = Path(report)
    name = p.name[: -len(".sqlite")] if p.name.endswith(".sqlite") else p.stem
    return p.with_name(name + ".manifest.json")


def speculative(report: str | Path) -> dict:
    """The manifest's ``speculative`` settings; for the embedded workload, completed from its command line
    with the workload's defaults (manifests written before every setting was recorded lack them)."""
    m = read_manifest(report) or {}
    spec = dict(m.get("speculative") or {})
    if spec.get("workload") and isinstance(m.get("command"), list):
        from nvtx_hooks.capture.manifest import speculative_config

        spec = {**speculative_config([str(t) for t in m["command"]]), **spec}
    return spec


def read_manifest(report: str | Path) -> dict | None:
    """The capture's manifest (beside it, or a bundled sample's), or None when there is none or it is not JSON."""
    p = manifest_path(report)
    if not p.exists():
        from nvtx_hooks.capture import samples

        if Path(report).resolve().parent == samples.cache_dir().resolve():
            p = samples.data_dir(Path(report).name.removesuffix(".sqlite")) / p.name
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
