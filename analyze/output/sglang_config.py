"""The per-batch-size draft-step tiers of a what-if per segment, as SGLang's adaptive speculation reads them.

SGLang (checked on 0.5.23: ``sglang/srt/speculative/adaptive_spec_params.py``) takes ``--speculative-adaptive
--speculative-adaptive-config FILE``: a JSON object whose integer-string keys are batch sizes, each the lower
bound of a tier (a batch is routed, after padding to its CUDA-graph batch size, to the largest key not above
it), with ``candidate_steps`` (non-negative ints; the step count is chosen among them at run time from the
observed acceptance) and the hysteresis knobs (``up_hysteresis``, ``down_hysteresis``, ``ceiling_coeff``).

:func:`tiers` turns the segments' best step counts into tiers: batch sizes in order, adjacent ones with the
same best step count merged, each tier's candidates its best step count and the current one (so that the run
can stay where it is measured to be when acceptance drops); :func:`config` is the JSON object; a prediction
that is extrapolated is not used (its segment keeps the current step count, said in ``_spectrace``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Tier", "tiers", "config", "write"]

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
    """Tiers from the what-if's segments (``segments`` as in its JSON: ``batch_size``, ``best_steps``)."""
    best: dict[int, int] = {}
    for s in segments:
        if s.get("batch_size") is None:
            continue
        b = s["best_steps"] if s.get("best_steps") is not None else steps_now
        best.setdefault(int(s["batch_size"]), b)  # a batch size met twice keeps its first segment's answer
    out: list[Tier] = []
    for bs in sorted(best):
        if out and out[-1].best_steps == best[bs]:
            t = out[-1]
            out[-1] = Tier(t.batch_from, t.best_steps, t.candidate_steps, (*t.batch_sizes, bs))
        else:
            out.append(Tier(bs if out else 1, best[bs], tuple(sorted({best[bs], steps_now})), (bs,)))
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
