"""Results for machines: JSON, CSV and SQLite (sqlite-utils) renderings of a :class:`~analyze.model.Result`."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sqlite3
import threading
from pathlib import Path
from urllib.parse import quote

import polars as pl

from nvtx_hooks.capture import files

from ..compute import (
    acceptance,
    anatomy,
    cycle_budget,
    findings,
    host_gaps,
    steady_tables,
    straggler,
    utilisation,
    whatif,
    whatif_replay,
)
from ..compute.cycles import cycles, selection
from ..compute.tokens import DEFINITION, summary
from ..model import InputError, Result
from .targets import as_input_error, check_db, fences, inputs_of

__all__ = ["CSV_TABLES", "TOP_KERNELS", "FINDING_KEYS", "document", "to_json", "frame", "to_csv", "to_db",
           "doc_json", "finite", "DB_REGISTRY"]

FINDING_KEYS = ("code", "severity", "phase", "rank", "every", "extra_ns", "cycles", "evidence", "action", "impact_ns",
                "share", "rank_is", "gross_ns", "claims", "counted_under")


def document(res: Result, found: list[findings.Finding] | None = None) -> dict:
    """The JSON document: :meth:`Result.to_dict` (every captured instance) plus the headline numbers over the
    steady state: ``steady`` (which cycles and why, and the cycle period's ``definition``), ``tokens`` (the cycle
    period with p50/p90, tokens per cycle, tokens/s, acceptance), ``budget``, ``phases_steady``,
    ``phases_steady_all_ranks``, ``seams_steady``, ``kernels``, ``cycle_classes`` (the slower cycles that recur,
    and the rare stalls left out, with where their time sits), ``segments`` (per decode batch size and step count), ``acceptance_per_position`` (per segment and the run:
    requests by accepted drafts, from the accept_histogram marks), ``host_gaps``
    (what the launching thread did in the host-bound gaps, :mod:`analyze.compute.host_gaps`),
    ``stragglers_steady`` (per phase and rank: the collective waiting each caused) and ``straggler`` (the one
    verdict per phase), ``findings``."""
    # The findings' tables first (findings.rule_inputs): made from the steady matched collectives, which are let go of
    # then (declared), before the what-if fit, the document's biggest working set. Then the findings (the fit) on a
    # second thread while this one builds the replay the fit asks for (the fit's largest step, when the fit will
    # build it: whatif.will_replay; a table: the fit waits for this one's) and makes the rest of the document; the
    # tables they ask for are the document's own (each made once): no number changes.
    finding, fit = None, False
    if found is None:
        findings.rule_inputs(res)
        fit = not findings.known(res)
        finding = _Beside(lambda: findings.find(res))
    try:
        if finding is not None and fit and whatif.will_replay(res):
            whatif_replay.replay(res)
        d = _document(res)
    except Exception:
        if finding is not None:
            finding.result()  # its failure first, as when the findings came first
        raise
    if finding is not None:
        found = finding.result()
    assert found is not None
    d["findings"] = [f.to_dict() for f in found]
    return d


class _Beside:
    """``fn()`` on a second thread: :meth:`result` waits for it and gives its value or raises what it raised. A daemon
    thread: a Ctrl-C does not wait for it (it computes, writes nothing)."""

    def __init__(self, fn):
        self.value, self.error = None, None
        self._fn = fn
        self._thread = threading.Thread(target=self._run, daemon=True, name="spectrace findings")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as e:  # handed to the caller by result()
            self.error = e
        finally:
            self._fn = None

    def result(self):
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.value


def _document(res: Result) -> dict:
    """:func:`document` but for its findings (a placeholder, in their place)."""
    d = res.to_dict()
    d["steady"] = {**selection(res).as_dict(), "definition": DEFINITION}
    d["tokens"] = summary(res).as_dict()
    d["budget"] = cycle_budget.budget(res).to_dicts()
    d["phases_steady"] = steady_tables.steady_phases(res).to_dicts()
    d["phases_steady_all_ranks"] = steady_tables.steady_phases_all_ranks(res).to_dicts()
    d["seams_steady"] = steady_tables.steady_seams(res).to_dicts()
    d["kernels"] = steady_tables.kernels(res, TOP_KERNELS).to_dicts()
    d["cycle_classes"] = [c.as_dict() for c in anatomy.cycle_classes(res)]
    d["segments"] = [s.as_dict() for s in anatomy.segments(res)]
    d["host_gaps"] = host_gaps.host_gaps(res).as_dict()
    d["acceptance_per_position"] = [a.as_dict() for a in acceptance.per_position(res)]
    st = steady_tables.stragglers(res)
    d["stragglers_steady"] = st.to_dicts()
    d["straggler"] = straggler.verdict(st).to_dicts()  # each phase's (the share rule: module straggler)
    d["findings"] = None  # (their place in the document: filled by document)
    util = utilisation.phases(res)
    if util.height:  # only for an export with GPU-metrics samples (docs/gpu-metrics.md)
        d["utilisation"] = util.to_dicts()
        d["utilisation_seams"] = utilisation.seams(res).to_dicts()
        d["gpu_metrics_period_ns"] = utilisation.period_ns(res)
    return d


def to_json(res: Result, found: list[findings.Finding] | None = None) -> str:
    return doc_json(document(res, found))


TOP_KERNELS = 10  # per phase, in the JSON document
CSV_TABLES = ("phases", "ranges", "seams", "ranks", "coverage", "instances", "host_calls", "phases_steady",
              "seams_steady", "budget", "kernels", "cycles", "cycle_classes", "segments", "acceptance_per_position",
              "host_gaps", "findings", "utilisation", "utilisation_seams", "gpu_metrics")


def frame(res: Result, name: str) -> pl.DataFrame:
    """One result table by name; ``phases``/``ranges``/``seams`` include all-ranks rows (rank null), and so do
    ``phases_steady``/``seams_steady`` (the steady state, :mod:`analyze.compute.steady_tables`)."""
    if name == "phases_steady":
        return pl.concat([steady_tables.steady_phases(res), steady_tables.steady_phases_all_ranks(res).drop("ranks")], how="diagonal_relaxed")
    if name == "seams_steady":
        s = steady_tables.steady_seams(res)
        return pl.concat([s, steady_tables.steady_seams_all_ranks(res).drop("ranks")], how="diagonal_relaxed") if s.height else s
    if name == "budget":
        return cycle_budget.budget(res)
    if name == "kernels":
        return steady_tables.kernels(res)
    if name == "cycles":
        return cycles(res)
    if name == "cycle_classes":  # one row per class and budget piece that grew (its pieces, flat)
        rows = [{**{k: v for k, v in c.as_dict().items() if k not in ("pieces", "keys", "waiting_ranks")},
                 "keys": ",".join(map(str, c.keys)), "waiting_ranks": ",".join(map(str, c.waiting_ranks))}
                for c in anatomy.cycle_classes(res)]
        return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"label": pl.String})
    if name == "host_gaps":  # per rank, scope, gap and item: µs per steady cycle
        return host_gaps.host_gaps(res).items
    if name == "acceptance_per_position":  # one row per segment (and the run) and draft position
        rows = [{"key": a.key, "segment": a.segment, "batch_size": a.batch_size, "steps": a.steps, "position": j + 1,
                 "accepted": a.accepted_at_position[j], "rate": a.rate_at_position[j]}
                for a in acceptance.per_position(res) for j in range(len(a.accepted_at_position))]
        return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"key": pl.String, "position": pl.Int64})
    if name == "segments":
        rows = [{k: v for k, v in s.as_dict().items() if k != "budget"} for s in anatomy.segments(res)]
        return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"key": pl.String})
    if name == "findings":  # a table's cells are flat: the claims as "piece=ns;…", counted_under as "CODE=ns;…"
        f = [{**x.to_dict(), "claims": ";".join(f"{c['piece']}={c['ns']:.0f}" for c in x.claims),
              "counted_under": ";".join(f"{u['code']}={u['ns']:.0f}" for u in x.counted_under)}
             for x in findings.find(res)]
        return pl.DataFrame(f) if f else pl.DataFrame(schema={k: pl.String for k in FINDING_KEYS})
    if name == "utilisation":  # GPU-metrics samples per phase (analyze.compute.utilisation); empty without
        p = utilisation.phases(res)
        return p.select(p.columns[: p.columns.index("note") + 1]) if p.height else p
    if name == "utilisation_seams":
        return utilisation.seams(res)
    if name == "gpu_metrics":  # every metric, long
        return utilisation.long(res)
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


def to_db(res: Result, path: str | Path, inputs=None) -> None:
    """Write every result table into the SQLite database ``path`` (tables of the same names replaced, the
    others kept), through SQLite itself.

    The tables are made with sqlite-utils in a database in memory, then copied into the target in one
    transaction on it (its own journal or WAL: a hot ``-journal`` is rolled back and committed ``-wal`` frames
    are read by SQLite, as for any writer), so a failed or interrupted write leaves it as it was. A new
    target is written under a temporary name and renamed into place. The target is a regular file or a new
    name, never an input (``inputs``, default the result's reports) by any name, nor its SQLite sidecars, nor
    in a cache (:func:`analyze.output.targets.check_db`); failures are one-line InputErrors.
    """
    p = Path(path)
    inputs = inputs if inputs is not None else (res.reports or [res.trace.path])
    real = check_db(p, inputs)
    mem = _tables_in_memory(res)
    try:
        if real.exists():
            _copy_tables(mem, real, p, "it is as it was")
        else:
            with as_input_error(), files.new_file(p, option="--db", what="the results database", inputs=inputs_of(
                    inputs), fences=fences(p, inputs)) as tmp:
                _copy_tables(mem, tmp, p, "nothing was written")
    finally:
        mem.close()


# the tables :func:`to_db` writes (and replaces: only those it made, listed in DB_REGISTRY)
_DB_TABLES = (*CSV_TABLES, "diagnostics", "meta")
DB_REGISTRY = "spectrace_tables"  # in a results database: the tables spectrace made there (one ``name`` a row)


def _rows(rows: list[dict]) -> list[dict]:
    """Rows SQLite can bind: strings that are not UTF-8 (a file name's bytes) with U+FFFD, as the reader does."""
    return [{k: files.clean(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]


def _tables_in_memory(res: Result) -> sqlite3.Connection:
    """The result tables in a new database in memory (sqlite-utils: its column types, ``meta``'s key)."""
    import sqlite_utils

    db = sqlite_utils.Database(sqlite3.connect(":memory:", uri=True))  # uri: ATTACH takes the target's URI
    for name in CSV_TABLES:
        rows = frame(res, name).to_dicts()
        if rows:
            db.table(name).insert_all(_rows(rows), alter=True)
    if res.diagnostics:
        db.table("diagnostics").insert_all(_rows([d.as_dict() for d in res.diagnostics]))
    meta = {k: v for k, v in res.to_dict().items() if isinstance(v, str | int | float) or v is None}
    db.table("meta").insert_all(_rows([{"key": k, "value": str(v)} for k, v in meta.items()]), pk="key")
    db.conn.commit()
    return db.conn


def _copy_tables(mem: sqlite3.Connection, target: Path, shown: Path, after: str) -> None:
    """Copy :data:`_DB_TABLES` from ``mem`` into the database file ``target`` in one transaction on it."""
    names = {n: sql for n, sql in mem.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
    uri = "file:" + quote(os.fsencode(target)) + "?mode=rw"
    mem.isolation_level = None
    try:
        mem.execute("ATTACH DATABASE ? AS dest", (uri,))
    except sqlite3.Error as e:
        raise _db_error(e, shown, after) from None
    try:
        mem.execute("BEGIN IMMEDIATE")
        try:
            ours = _ours(mem, shown)
            for name in _DB_TABLES:
                if name in ours:
                    mem.execute(f'DROP TABLE IF EXISTS dest."{name}"')
                sql = names.get(name) or ""
                if sql.startswith("CREATE TABLE "):  # as sqlite-utils made it, in the target
                    mem.execute("CREATE TABLE dest." + sql[len("CREATE TABLE "):])
                    mem.execute(f'INSERT INTO dest."{name}" SELECT * FROM main."{name}"')
            made = sorted(n for n in _DB_TABLES if names.get(n, "").startswith("CREATE TABLE "))
            mem.execute(f'CREATE TABLE IF NOT EXISTS dest."{DB_REGISTRY}" (name TEXT PRIMARY KEY)')
            mem.execute(f'DELETE FROM dest."{DB_REGISTRY}"')
            mem.executemany(f'INSERT INTO dest."{DB_REGISTRY}" VALUES (?)', [(n,) for n in made])
            mem.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                mem.execute("ROLLBACK")
            raise
    except sqlite3.Error as e:
        raise _db_error(e, shown, after) from None
    finally:
        with contextlib.suppress(sqlite3.Error):
            mem.execute("DETACH DATABASE dest")


def _ours(mem: sqlite3.Connection, shown: Path) -> set[str]:
    """The tables of the attached ``dest`` database that spectrace made (listed in :data:`DB_REGISTRY`; in a
    database written before the registry, the result tables when its ``meta`` says spectrace wrote it);
    InputError when a table of a result's name is someone else's (it is never dropped)."""
    tables = {n for (n,) in mem.execute("SELECT name FROM dest.sqlite_master WHERE type = 'table'")}
    if DB_REGISTRY in tables:
        ours = {n for (n,) in mem.execute(f'SELECT name FROM dest."{DB_REGISTRY}"')}
    elif "meta" in tables and _legacy_meta(mem):
        ours = set(_DB_TABLES)
    else:
        ours = set()
    foreign = sorted(n for n in _DB_TABLES if n in tables and n not in ours)
    if foreign:
        raise InputError(f"{shown}: has table{'s' if len(foreign) > 1 else ''} {', '.join(foreign)} that spectrace did "
                         "not make (a result table has that name; it is never dropped): it is as it was; choose "
                         "another --db file", "OUTPUT_NOT_OURS")
    return ours


def _legacy_meta(mem: sqlite3.Connection) -> bool:
    try:
        row = mem.execute("SELECT value FROM dest.meta WHERE key = 'spectrace_version'").fetchone()
    except sqlite3.Error:
        return False
    return bool(row)


def _db_error(e: sqlite3.Error, shown: Path, after: str) -> InputError:
    return InputError(f"{shown}: cannot write the results database into it ({e}); {after}; choose another --db "
                      "file", "BAD_OUTPUT")


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
