"""The capture's manifest (``NAME.manifest.json`` beside ``NAME.sqlite``, written by ``spectrace trace``): how
the workload ran (its speculative settings, the recorded environment, its own throughput), read once per use.

A manifest is an input like the export: a regular file only (a pipe or a device is refused without being
opened), read whole up to :data:`MANIFEST_MAX_BYTES`, a JSON object whose keys have the documented types and
whose numbers are physical (:data:`nvtx_hooks.capture.bounds`: draft steps within ``--steps-now``'s bounds, a
batch a server can hold, a throughput a GPU can reach). Anything else is one line naming the file and the key
(:class:`~analyze.model.InputError`), never a traceback and never a number used as it is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from nvtx_hooks.capture.bounds import BATCH_MAX, CYCLES_PER_S_MAX, STEPS_MAX, in_bounds, whole
from nvtx_hooks.capture.files import InputFileError, read_input

from ..model import InputError

__all__ = ["MANIFEST_MAX_BYTES", "manifest_path", "speculative", "read_manifest", "check_manifest"]

MANIFEST_MAX_BYTES = 16 << 20  # a manifest is a few kB (its program output included)
# the documented keys whose JSON type is fixed (others are kept as they are)
_OBJECTS = ("speculative", "nsys", "env_added", "nccl_env", "passes")
_LISTS = ("command", "program_output", "gpus")


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
        _check_spec(manifest_path(report), spec)
    return spec


def read_manifest(report: str | Path) -> dict | None:
    """The capture's manifest (beside it, or a bundled sample's), checked (:func:`check_manifest`); None when
    there is none. InputError when it cannot be read safely or is not a manifest's shape."""
    p = manifest_path(report)
    if not (p.exists() or p.is_symlink()):
        from nvtx_hooks.capture import samples

        if Path(report).resolve().parent == samples.cache_dir().resolve():
            p = samples.data_dir(Path(report).name.removesuffix(".sqlite")) / p.name
        if not p.exists():
            return None
    try:
        data = read_input(p, "the manifest", MANIFEST_MAX_BYTES)
    except InputFileError as e:
        raise InputError(f"{e} (remove or fix it: it is read by every verb)", e.code) from None
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except RecursionError:
        raise InputError(f"{p}: the manifest is nested deeper than a JSON reader goes; not a spectrace manifest "
                         "(remove or fix it)", "BAD_MANIFEST") from None
    except ValueError as e:
        raise InputError(f"{p}: the manifest is not JSON ({e}); remove or fix it", "BAD_MANIFEST") from None
    check_manifest(p, doc)
    return doc


def _type(v: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number")


def check_manifest(path: Path, doc: object) -> None:
    """InputError (naming ``path`` and the key) unless ``doc`` has a manifest's shape and physical values."""
    if not isinstance(doc, dict):
        raise InputError(f"{path}: the manifest is not a JSON object (it is {_type(doc)}); remove or fix it",
                         "BAD_MANIFEST")
    for key, want, kind in [*((k, dict, "an object") for k in _OBJECTS), *((k, list, "a list") for k in _LISTS)]:
        v = doc.get(key)
        if v is not None and not isinstance(v, want):
            raise InputError(f"{path}: the manifest's {key!r} is {_type(v)}, not {kind}; remove or fix it",
                             "BAD_MANIFEST")
    _check_spec(path, doc.get("speculative") or {})
    for i, r in enumerate(doc.get("program_output") or []):
        rate = r.get("cycles_per_s") if isinstance(r, dict) else None
        if rate is not None and not in_bounds(rate, 0, CYCLES_PER_S_MAX):
            raise InputError(f"{path}: the manifest's program_output[{i}].cycles_per_s = {_shown(rate)} is not a "
                             f"throughput a GPU reaches (0 to {CYCLES_PER_S_MAX:,.0f}); remove or fix it",
                             "BAD_MANIFEST")


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_spec(path: Path, spec: dict) -> None:
    for key, lo, hi in (("steps", 0, STEPS_MAX), ("batch", 1, BATCH_MAX), ("tp", 1, BATCH_MAX)):
        v = spec.get(key)
        if v is None:
            continue
        if not whole(v) and not (isinstance(v, float) and math.isfinite(v) and v.is_integer()):
            raise InputError(f"{path}: the manifest's speculative.{key} is {_type(v)} {_shown(v)}, not an integer; "
                             "remove or fix it", "BAD_MANIFEST")
        if not lo <= v <= hi:
            raise InputError(f"{path}: the manifest's speculative.{key} = {_shown(v)} is outside {lo} to {hi:,} "
                             f"({'--steps-now' if key == 'steps' else 'what a server runs'}); remove or fix it",
                             "BAD_MANIFEST")
