"""The per-batch-size draft-step tiers of a what-if per segment, as SGLang's adaptive speculation reads them.

SGLang (checked on 0.5.23: ``sglang/srt/speculative/adaptive_spec_params.py``) takes ``--speculative-adaptive
--speculative-adaptive-config FILE``: a JSON object whose integer-string keys are batch sizes, each the lower
bound of a tier (a batch is routed, after padding to its CUDA-graph batch size, to the largest key not above
it), with ``candidate_steps`` (non-negative ints; the step count is chosen among them at run time from the
observed acceptance) and the hysteresis knobs (``up_hysteresis``, ``down_hysteresis``, ``ceiling_coeff``).

:func:`tiers` turns the segments' best step counts into tiers: batch sizes in order, adjacent ones with the
same best step count merged, each tier's candidates its best step count and the current one (so that the run
can stay where it is measured to be when acceptance drops); :func:`config` is the JSON object; a prediction
that is extrapolated is not used (its segment keeps the current step count, said in ``_spectrace``). The current
step count is each batch size's own (the step count its cycles ran: an adaptive run has one per batch size), so a
batch size whose best is 0 steps (verify only) gets a 0-step tier, as SGLang's default tiers have (``"64": [0]``).

:func:`read` reads a config the way SGLang 0.5.23 does (``_load_adaptive_config``: integer-string keys, each with a
non-empty ``candidate_steps`` list of non-negative ints; other keys ignored; at least one such key) and
:func:`route` routes a batch size to its tier (``_find_closest_bs``: the largest key not above it, else the smallest;
the padding to a CUDA-graph batch size first is not known here); :func:`compare` says, per tier of the user's
current config, what the what-if measured and predicts ("tier 8: [0, 1, 3]; measured best 3; +4 % tokens/s
predicted").
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Tier", "tiers", "config", "write", "read", "route", "compare"]

_SGLANG_CHECKED = "0.5.23"
_KNOBS = {"up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0}  # SGLang's defaults for a tier


@dataclass(frozen=True)
class Tier:
    """Batch sizes from ``batch_from`` (up to the next tier's) and the draft steps to run them at."""

    batch_from: int
    best_steps: int
    candidate_steps: tuple[int, ...]
    batch_sizes: tuple[int, ...]  # the measured batch sizes the tier covers


def tiers(segments: list[dict], steps_now: int) -> list[Tier]:
    """Tiers from the what-if's segments (``segments`` as in its JSON: ``batch_size``, ``best_steps`` and the batch
    size's own current ``steps_now``; ``steps_now``: the run's, for a segment without one)."""
    best: dict[int, int] = {}
    now: dict[int, int] = {}
    for s in segments:
        if s.get("batch_size") is None:
            continue
        cur = s["steps_now"] if s.get("steps_now") is not None else steps_now
        b = s["best_steps"] if s.get("best_steps") is not None else cur
        best.setdefault(int(s["batch_size"]), b)  # a batch size met twice keeps its first segment's answer
        now.setdefault(int(s["batch_size"]), cur)
    out: list[Tier] = []
    for bs in sorted(best):
        cands = {best[bs], now[bs]}
        if out and out[-1].best_steps == best[bs]:
            t = out[-1]
            out[-1] = Tier(t.batch_from, t.best_steps, tuple(sorted({*t.candidate_steps, *cands})),
                           (*t.batch_sizes, bs))
        else:
            out.append(Tier(bs if out else 1, best[bs], tuple(sorted(cands)), (bs,)))
    return out


def config(segments: list[dict], steps_now: int, source: str = "") -> dict:
    """The JSON object SGLang's ``--speculative-adaptive-config`` reads (its keys: the tiers' first batch sizes);
    ``_spectrace`` (ignored by SGLang: not an integer key) says where it comes from."""
    ts = tiers(segments, steps_now)
    out: dict = {str(t.batch_from): {"candidate_steps": list(t.candidate_steps), **_KNOBS} for t in ts}
    out["_spectrace"] = {"source": source, "steps_now": steps_now, "sglang_checked": _SGLANG_CHECKED,
                         "tiers": [{"batch_from": t.batch_from, "best_steps": t.best_steps,
                                    "measured_batch_sizes": list(t.batch_sizes)} for t in ts]}
    return out


def write(path: str | Path, segments: list[dict], steps_now: int, source: str, inputs=(), force: bool = False
          ) -> Path:
    """Write :func:`config` to ``path`` (a new file, renamed into place; never an input, nor a report's manifest;
    an existing file only with ``force``); its path."""
    from nvtx_hooks.capture.files import write_new

    if not tiers(segments, steps_now):
        from ..model import InputError

        raise InputError("--sglang-config needs a trace whose cycles carry their batch size (the hooks' payload) "
                         "in two or more segments; this one has none", "NO_SEGMENTS")
    from .targets import as_input_error, fences, inputs_of

    data = json.dumps(config(segments, steps_now, source), indent=2) + "\n"
    with as_input_error():
        return write_new(path, data.encode(), option="--sglang-config", what="the SGLang config",
                         inputs=inputs_of(inputs), fences=fences(path, inputs), replace=force)



def read(path: str | Path) -> dict[int, list[int]]:
    """A ``--speculative-adaptive-config`` file as SGLang 0.5.23 reads it (``_load_adaptive_config``): batch-size
    tier → candidate steps (sorted, each once, as its ``AdaptiveStepSlot`` keeps them). InputError (exit 2) for a
    file SGLang would refuse, with SGLang's reason."""
    from nvtx_hooks.capture.files import InputFileError, read_input

    from ..model import InputError

    try:  # a regular file of bounded size (never a pipe: it would block)
        cfg = json.loads(read_input(path, "--current-sglang-config"))
    except InputFileError as e:
        raise InputError(str(e), "BAD_OPTION") from None
    except (OSError, ValueError) as e:
        raise InputError(f"--current-sglang-config {path}: not a readable JSON file ({e})", "BAD_OPTION") from None
    if not isinstance(cfg, dict):
        raise InputError(f"--current-sglang-config {path}: not a JSON object", "BAD_OPTION")
    out: dict[int, list[int]] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in steps):
            raise InputError(f"--current-sglang-config {path}: BS {key}: candidate_steps must be a list of "
                             f"non-negative ints, got {steps!r} (SGLang refuses it too)", "BAD_OPTION")
        out[int(key)] = sorted(set(steps))
    if not out:
        raise InputError(f"--current-sglang-config {path}: no integer-string batch-size key (SGLang refuses it too)",
                         "BAD_OPTION")
    return dict(sorted(out.items()))


def route(config: dict[int, list[int]], batch_size: int) -> int:
    """The tier (its key) SGLang routes ``batch_size`` to: the largest key not above it, else the smallest
    (``_find_closest_bs``; after SGLang's padding to a CUDA-graph batch size, which is not known here)."""
    keys = sorted(config)
    return keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]


def compare(segments: list[dict], current: dict[int, list[int]]) -> list[str]:
    """Per tier of the user's current config: its candidates, the measured batch sizes it holds, the step count
    each ran, its predicted best and the tokens/s predicted at the best against the best of the tier's
    candidates that are not extrapolated (a tier whose candidates include the best: nothing to change)."""
    out = []
    by_tier: dict[int, list[dict]] = {}
    for s in segments:
        if s.get("batch_size") is not None:
            by_tier.setdefault(route(current, int(s["batch_size"])), []).append(s)
    for key, cands in current.items():
        segs = by_tier.get(key, [])
        head = f"tier {key}: {cands}"
        if not segs:
            out.append(f"{head}; no measured batch size routes here")
            continue
        parts = []
        for s in segs:
            pred = {p["steps"]: p for p in s["predictions"]}
            best = s.get("best_steps")
            ran = s.get("steps_now")
            tps = {k: p["tokens_per_s"] for k, p in pred.items()
                   if p["tokens_per_s"] is not None and not p["extrapolated"]}
            in_tier = [c for c in cands if c in tps]
            txt = f"batch {s['batch_size']} ran {ran} step{'s' if ran != 1 else ''}"
            if best is None:
                parts.append(txt + ", best unknown (acceptance unknown)")
                continue
            txt += f", measured best {best}"
            if best in cands:
                parts.append(txt + " (a candidate: keep)")
            elif in_tier and best in tps:
                top = max(in_tier, key=lambda c: tps[c])
                gain = tps[best] / tps[top] - 1
                parts.append(txt + f": {100 * gain:+.1f} % tokens/s predicted at {best} against the tier's best "
                             f"candidate {top}; add {best}")
            else:
                parts.append(txt + f": add {best} (the tier's candidates are predicted here only by extrapolation)")
        out.append(f"{head}; " + "; ".join(parts))
    return out
