"""Results for machines: JSON, CSV and SQLite (sqlite-utils) renderings of a :class:`~analyze.model.Result`."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sqlite3
import uuid
from pathlib import Path

import polars as pl

from ..compute import anatomy, collectives, findings, headline
from ..compute.tokens import DEFINITION, cycles, selection, summary
from ..model import InputError, Result
from .targets import os_error, refuse_input

FINDING_KEYS = ("code", "severity", "phase", "rank", "every", "extra_ns", "cycles", "evidence", "action", "impact_ns",
                "share", "rank_is")


def document(res: Result, found: list[dict] | None = None) -> dict:
    """The JSON document: :meth:`Result.to_dict` (every captured instance) plus the headline numbers over the
    steady state: ``steady`` (which cycles and why, and the cycle period's ``definition``), ``tokens`` (the cycle
    period with p50/p90, tokens per cycle, tokens/s, acceptance), ``budget``, ``phases_steady``,
    ``phases_steady_all_ranks``, ``seams_steady``, ``kernels``, ``cycle_classes`` (the slower cycles that recur,
    and the rare stalls left out, with where their time sits), ``segments`` (per decode batch size),
    ``stragglers_steady`` (per phase and rank: the collective waiting each caused) and ``straggler`` (the one
    verdict per phase), ``findings``."""
    d = res.to_dict()
    d["steady"] = {**selection(res), "definition": DEFINITION}
    d["tokens"] = summary(res).as_dict()
    d["budget"] = headline.budget(res).to_dicts()
    d["phases_steady"] = headline.phases(res).to_dicts()
    d["phases_steady_all_ranks"] = headline.phases_all(res).to_dicts()
    d["seams_steady"] = headline.seams(res).to_dicts()
    d["kernels"] = headline.kernels(res, TOP_KERNELS).to_dicts()
    d["cycle_classes"] = [c.as_dict() for c in anatomy.cycle_classes(res)]
    d["segments"] = [s.as_dict() for s in anatomy.segments(res)]
    st = headline.stragglers(res)
    d["stragglers_steady"] = st.to_dicts()
    d["straggler"] = collectives.verdict(st).to_dicts() if st.height else []
    d["findings"] = findings.find(res) if found is None else found
    return d


def to_json(res: Result, found: list[dict] | None = None) -> str:
    return doc_json(document(res, found))


TOP_KERNELS = 10  # per phase, in the JSON document
CSV_TABLES = ("phases", "ranges", "seams", "ranks", "coverage", "instances", "host_calls", "phases_steady",
              "seams_steady", "budget", "kernels", "cycles", "cycle_classes", "segments", "findings")


def frame(res: Result, name: str) -> pl.DataFrame:
    """One result table by name; ``phases``/``ranges``/``seams`` include all-ranks rows (rank null), and so do
    ``phases_steady``/``seams_steady`` (the steady state, :mod:`analyze.compute.headline`)."""
    if name == "phases_steady":
        return pl.concat([headline.phases(res), headline.phases_all(res).drop("ranks")], how="diagonal_relaxed")
    if name == "seams_steady":
        s = headline.seams(res)
        return pl.concat([s, headline.seams_all(res).drop("ranks")], how="diagonal_relaxed") if s.height else s
    if name == "budget":
        return headline.budget(res)
    if name == "kernels":
        return headline.kernels(res)
    if name == "cycles":
        return cycles(res)
    if name == "cycle_classes":  # one row per class and budget piece that grew (its pieces, flat)
        rows = [{**{k: v for k, v in c.as_dict().items() if k not in ("pieces", "keys", "waiting_ranks")},
                 "keys": ",".join(map(str, c.keys)), "waiting_ranks": ",".join(map(str, c.waiting_ranks))}
                for c in anatomy.cycle_classes(res)]
        return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"label": pl.String})
    if name == "segments":
        rows = [{k: v for k, v in s.as_dict().items() if k != "budget"} for s in anatomy.segments(res)]
        return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"key": pl.String})
    if name == "findings":
        f = findings.find(res)
        return pl.DataFrame(f) if f else pl.DataFrame(schema={k: pl.String for k in FINDING_KEYS})
    if name == "phases":
        return pl.concat([res.phases, res.phases_all.drop("ranks")], how="diagonal_relaxed")
    if name == "ranges":
        return pl.concat([res.ranges, res.ranges_all.drop("ranks")], how="diagonal_relaxed")
    if name == "seams":
        return pl.concat([res.seams, res.seams_all.drop("ranks")], how="diagonal_relaxed")
    if name == "ranks":
        return res.ranks.with_columns(pl.col("devices").cast(pl.List(pl.String)).list.join(","))
    if name == "coverage":
        return res.coverage
    if name == "instances":
        return res.instances
    if name == "host_calls":  # the key CUDA API calls (analyze.compute.host.CALL_SCHEMA)
        return res.host_calls if res.host_calls is not None else pl.DataFrame()
    raise InputError(f"unknown table {name!r}; one of {', '.join(CSV_TABLES)}", "BAD_TABLE")


def to_csv(res: Result, name: str = "phases") -> str:
    buf = io.StringIO()
    frame(res, name).write_csv(buf)
    return buf.getvalue()


def to_db(res: Result, path: str | Path) -> None:
    """Write every result table into a SQLite database with sqlite-utils (tables replaced, others kept).

    Written to a temporary file beside it and renamed into place: a failed write leaves the old file as it was.
    Never an input report (:func:`analyze.output.targets.refuse_input`); failures are one-line InputErrors.
    """
    p = Path(path)
    refuse_input(p, res.reports or [res.trace.path], "--db")
    dest = p.resolve() if p.is_symlink() else p
    tmp = None
    try:
        name = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:12]}")
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # the umask applies, as for any file
        tmp = name
        if dest.exists():
            shutil.copyfile(dest, tmp)
            shutil.copymode(dest, tmp)
        _write_db(res, tmp)
        os.replace(tmp, dest)
        tmp = None
    except OSError as e:
        raise os_error(e, p, "the results database") from None
    except sqlite3.DatabaseError as e:
        raise InputError(f"{p}: cannot write the results database into it ({e}); choose another --db file",
                         "BAD_OUTPUT") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _write_db(res: Result, p: Path) -> None:
    import sqlite_utils

    db = sqlite_utils.Database(p)
    for name in CSV_TABLES:
        db[name].drop(ignore=True)
        rows = frame(res, name).to_dicts()
        if rows:
            db[name].insert_all(rows, alter=True)
    db["diagnostics"].drop(ignore=True)
    if res.diagnostics:
        db["diagnostics"].insert_all([d.as_dict() for d in res.diagnostics])
    db["meta"].drop(ignore=True)
    meta = {k: v for k, v in res.to_dict().items() if isinstance(v, str | int | float) or v is None}
    db["meta"].insert_all([{"key": k, "value": str(v)} for k, v in meta.items()], pk="key")
    db.close()


def doc_json(doc: dict) -> str:
    """A JSON document (analyze, compare, whatif, comm) as indented text: valid JSON, NaN and infinities null."""
    return json.dumps(finite(doc), indent=2, default=str, allow_nan=False) + "\n"


def finite(v):
    """``v`` with every NaN or infinite float (at any depth of dicts and lists) replaced by None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [finite(x) for x in v]
    return v
