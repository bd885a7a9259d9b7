"""Which GPU kernels are communication: a maintained table of kernel-name patterns.

Each row names a *family* (nccl, custom_ar, ...), a regex searched in the demangled kernel name,
and where the name comes from. Users extend it with ``--comm-pattern FAMILY=REGEX`` or a file
(one ``FAMILY=REGEX`` per line). Peer-to-peer memcpy (``[CUDA memcpy PtoP]``) counts as
communication too. Names matching :data:`EXCLUDE` are never communication.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from nvtx_hooks.capture.files import InputFileError, read_input

from ..model import InputError
from .regex import check_regex

if TYPE_CHECKING:
    from polars.expr.whenthen import ChainedThen, Then

__all__ = ["CommPattern", "PATTERNS", "EXCLUDE", "load_patterns", "checked_patterns", "family_expr", "classify"]


@dataclass(frozen=True)
class CommPattern:
    family: str
    regex: str
    source: str


PATTERNS: tuple[CommPattern, ...] = (
    CommPattern("nccl", r"\bncclDevKernel_|\bncclKernel_|\bncclSymk", "NCCL ≥2.19 / <2.19 / ≥2.27 symmetric kernels"),
    CommPattern("custom_ar", r"cross_device_reduce_[12]stage", "sgl-kernel / vLLM custom all-reduce (vllm:: or sglang::)"),
    CommPattern("custom_ar", r"\b(one|two)ShotAllReduceKernel", "older sgl-kernel TRT-LLM-derived custom all-reduce"),
    CommPattern("custom_ar", r"\ball_reduce_(one|two)_shot(_push|_pull)?_kernel",
                "SGLang JIT custom all-reduce v2 (0.5.10–0.5.15)"),
    CommPattern("custom_ar", r"\ball_reduce_[12]shot_(push|pull)_kernel|\bsglang::all_reduce_kernel",
                "SGLang custom all-reduce (0.5.18+)"),
    CommPattern("flashinfer_ar", r"allreduce_fusion_kernel|trtllm_allreduce|\blamport",
                "FlashInfer / TRT-LLM all-reduce fusion"),
    CommPattern("torch_symm_mem",
                r"\b(one|two)_shot_all_reduce_kernel|\bmultimem_(all_reduce|all_gather|reduce_scatter)|symm_mem",
                "torch symmetric memory"),
    CommPattern("mscclpp", r"\ballreduce_[12]shotLL|mscclpp", "MSCCL++ (sgl-kernel)"),
    CommPattern("quick_ar", r"quick_?all_?reduce|\bquickreduce", "AMD quick all-reduce"),
    CommPattern("ep_alltoall", r"\bdeep_ep::|\bdeepep", "DeepEP expert-parallel dispatch/combine"),
    CommPattern("collective", r"(?i)\ball_?gather\w*kernel|\breduce_?scatter\w*kernel|\ball_?to_?all\w*kernel",
                "other all-gather / reduce-scatter / all-to-all kernels"),
)

# Helpers that run next to collectives but move no data between GPUs.
EXCLUDE = r"\bsglang::memcpy_kernel\b"

_P2P_LABEL = "[CUDA memcpy PtoP]"


def load_patterns(extra: Iterable[str] = (), files: Iterable[str | Path] = ()) -> list[CommPattern]:
    """The built-in table plus user ``FAMILY=REGEX`` entries (from arguments and files)."""
    out = list(PATTERNS)
    entries = [(e, "--comm-pattern") for e in extra]
    for f in files:
        p = Path(f)
        if not p.exists():
            raise InputError(f"{p}: no such communication pattern file", "NO_FILE")
        if p.is_dir():
            raise InputError(f"{p}: is a directory, not a communication pattern file", "BAD_PATTERN")
        try:
            text = read_input(p, "--comm-patterns-file").decode()
        except InputFileError as e:
            raise InputError(str(e), e.code) from None
        except UnicodeDecodeError as e:
            raise InputError(f"{p}: not UTF-8 text (byte {e.start}); save it as UTF-8", "BAD_PATTERN") from None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line and not line.startswith("#"):
                entries.append((line, f"{p}:{n}"))
    for entry, where in entries:
        fam, sep, rx = entry.partition("=")
        if not sep or not fam.strip() or not rx:
            raise InputError(f"{where}: expected FAMILY=REGEX, got {entry!r}", "BAD_PATTERN")
        check_regex(rx, where)
        out.append(CommPattern(fam.strip(), rx, where))
    return out


def checked_patterns(patterns: object) -> list[CommPattern] | None:
    """The API's ``comm_patterns`` as documented: None (the built-in table) or a list of :class:`CommPattern`;
    ``"FAMILY=REGEX"`` strings in the list are read as ``--comm-pattern`` reads them (added to the built-in
    table). InputError for anything else (a lone string, a dict, ...)."""
    if patterns is None:
        return None
    if isinstance(patterns, str | bytes) or not isinstance(patterns, Iterable):
        raise InputError(f"comm_patterns must be a list of CommPattern or 'FAMILY=REGEX' strings, not "
                         f"{type(patterns).__name__} {str(patterns)[:60]!r}", "BAD_OPTION")
    items = list(patterns)
    bad = [x for x in items if not isinstance(x, CommPattern | str)]
    if bad:
        raise InputError(f"comm_patterns must be a list of CommPattern or 'FAMILY=REGEX' strings; it holds "
                         f"{type(bad[0]).__name__} {str(bad[0])[:60]!r}", "BAD_OPTION")
    if not any(isinstance(x, str) for x in items):
        for x in items:
            check_regex(x.regex, f"comm_patterns {x.family}")
        return items
    own = [x for x in items if isinstance(x, CommPattern)]
    return [*(own or PATTERNS), *load_patterns([x for x in items if isinstance(x, str)])[len(PATTERNS):]]


def family_expr(name: pl.Expr, patterns: Iterable[CommPattern] = PATTERNS) -> pl.Expr:
    """The communication family of each kernel name, or null for compute."""
    expr: Then | ChainedThen = pl.when(name.str.contains(EXCLUDE)).then(pl.lit(None, pl.String))
    for p in patterns:
        expr = expr.when(name.str.contains(p.regex)).then(pl.lit(p.family))
    expr = expr.when(name == _P2P_LABEL).then(pl.lit("p2p_copy"))
    return expr.otherwise(pl.lit(None, pl.String))


def classify(names: Iterable[str], patterns: Iterable[CommPattern] = PATTERNS) -> list[str | None]:
    """Family per name (convenience for tests and docs)."""
    s = pl.Series("name", list(names), dtype=pl.String)
    return pl.select(family_expr(pl.lit(s), patterns)).to_series().to_list()
