"""GPU-metrics samples per phase: the bundled real H200 capture with 20 kHz GPU metrics
(tests/data/h200_tp1/tp1_gpumetrics_graph, `tests/device/gpu_metrics_per_phase.sh`) against computations written here from the
raw ``GPU_METRICS`` rows, and synthetic edge cases (a phase shorter than the sampling period, samples on one
rank only, two GPUs in one process, an export without samples)."""

from __future__ import annotations

import lzma
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analyze import api
from analyze.compute import findings, utilisation
from analyze.model import CycleChoice
from analyze.read import gpu_metrics
from bench.export_dir import write_export_dir

DATA = Path(__file__).parent / "data"


def _unpack(src: Path, dest: Path) -> Path:
    out = dest / src.name.removesuffix(".xz")
    with lzma.open(src) as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g)
    man = src.with_name(src.name.removesuffix(".sqlite.xz") + ".manifest.json")
    if man.exists():
        shutil.copyfile(man, dest / man.name)
    return out


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    return _unpack(DATA / "h200_tp1" / "tp1_gpumetrics_graph.sqlite.xz", tmp_path_factory.mktemp("gm"))


@pytest.fixture(scope="module")
def res(capture):
    return api.analyze(str(capture))


def _raw(path: Path, name: str) -> np.ndarray:
    """(timestamp, value) of one metric by its nsys name, straight from SQLite."""
    con = sqlite3.connect(path)
    rows = con.execute("SELECT g.timestamp, g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t "
                       "ON t.typeId = g.typeId AND t.metricId = g.metricId WHERE t.metricName = ? "
                       "ORDER BY g.timestamp", (name,)).fetchall()
    con.close()
    return np.array(rows, dtype=np.float64)


def test_metrics_read_by_meaning(capture):
    s = gpu_metrics.read(capture)
    assert s is not None and s.gpus == [0] and s.unplaced_types == 0
    assert 49_900 <= s.period_ns <= 50_100  # 20 kHz
    have = set(s.metrics["metric"])
    assert set(gpu_metrics.MAIN) <= have and "gr_active_pct" in have
    # 225,654 rows = 22 metrics x 10,257 sample times, all on GPU 0
    assert s.samples.height == 225_654 and s.samples["start"].n_unique() == 10_257
    clock = s.samples.filter(pl.col("metric") == "gpc_clock_mhz")["value"]
    assert 500 < clock.median() < 2_500  # stored in Hz, read as MHz


def test_a_sample_summarises_the_interval_after_its_timestamp(capture):
    """GR Active against the GPU-busy share traced by CUPTI: the 50 µs after each timestamp fit, the 50 µs before
    do not (the assumption :mod:`analyze.read.gpu_metrics` makes)."""
    gr = _raw(capture, "GR Active [Throughput %]")
    con = sqlite3.connect(capture)
    ops = sorted(con.execute(" UNION ALL ".join(f"SELECT start, end FROM {t}" for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
        "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"))).fetchall())
    con.close()
    merged: list[list[int]] = []
    for a, b in ops:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    m = np.array(merged, dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(m[:, 1] - m[:, 0])])

    def busy_until(x):
        i = np.searchsorted(m[:, 0], x, side="right")
        j = np.maximum(i - 1, 0)
        return cum[j] + np.where(i > 0, np.clip(np.minimum(x, m[j, 1]) - m[j, 0], 0, None), 0)

    t, v = gr[:, 0], gr[:, 1]
    after = (busy_until(t + 50_000) - busy_until(t)) / 50_000 * 100
    before = (busy_until(t) - busy_until(t - 50_000)) / 50_000 * 100
    err_after, err_before = np.mean(np.abs(after - v)), np.mean(np.abs(before - v))
    assert err_after < 2.0 and err_before > 2 * err_after


def _independent(path: Path, spans: pl.DataFrame, name: str, period: int) -> tuple[float, int]:
    """Time-weighted mean of one metric over the spans, in plain SQL over the raw rows: each sample covers
    [timestamp, next timestamp) and counts by its overlap with a span; spans under 2 periods are left out."""
    con = sqlite3.connect(path)
    con.execute("CREATE TEMP TABLE span(s INTEGER, e INTEGER)")
    con.executemany("INSERT INTO span VALUES (?, ?)", spans.select("start", "end").rows())
    num, den, n = con.execute(f"""
        WITH x AS (SELECT g.timestamp AS a, LEAD(g.timestamp, 1, g.timestamp + {period}) OVER (ORDER BY g.timestamp)
                          AS b, g.value AS v
                   FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t USING (typeId, metricId)
                   WHERE t.metricName = ?),
             o AS (SELECT x.v, MIN(x.b, span.e) - MAX(x.a, span.s) AS w FROM span JOIN x
                   ON x.a < span.e AND x.b > span.s WHERE span.e - span.s >= {2 * period})
        SELECT SUM(v * w), SUM(w), COUNT(*) FROM o""", (name,)).fetchone()
    con.close()
    return num / den, n


@pytest.mark.parametrize("metric,name", [("dram_read_pct", "DRAM Read Bandwidth [Throughput %]"),
                                         ("tensor_active_pct", "Tensor Active [Throughput %]"),
                                         ("sm_active_pct", "SMs Active [Throughput %]")])
def test_phase_means_match_sql_over_the_raw_rows(res, capture, metric, name):
    inst = utilisation.instances(res)
    u = utilisation.phases(res).filter(pl.col("rank").is_null())
    period = utilisation.period_ns(res)
    checked = 0
    for phase, scope in [("verify", "all"), ("draft", "all"), ("verify", "batch 1"), ("verify", "batch 128"),
                         ("draft", "steady")]:
        sel = inst.filter(pl.col("phase") == phase)
        sel = sel if scope == "all" else sel.filter("steady") if scope == "steady" else sel.filter(
            pl.col("segment") == scope)
        want, n = _independent(capture, sel, name, period)
        row = u.filter((pl.col("phase") == phase) & (pl.col("scope") == scope)).row(0, named=True)
        assert row[metric] == pytest.approx(want, abs=1e-6)
        assert row["samples"] == n
        checked += 1
        if phase != "verify":
            continue
        # verify's spans (1-3 ms, 20-60 samples each): within 2 points of the plainest estimate too, the plain
        # mean of the samples that start inside the spans (for draft's 200 µs spans the edges differ more)
        raw = _raw(capture, name)
        inside = np.zeros(len(raw), bool)
        for s, e in sel.filter((pl.col("end") - pl.col("start")) >= 2 * period).select("start", "end").rows():
            inside |= (raw[:, 0] >= s) & (raw[:, 0] < e)
        assert abs(row[metric] - raw[inside, 1].mean()) < 2.0
    assert checked == 5


def test_verify_is_memory_bound_at_batch_1_and_compute_bound_at_128(res):
    u = utilisation.phases(res).filter(pl.col("rank").is_null() & (pl.col("phase") == "verify"))
    b1 = u.filter(pl.col("scope") == "batch 1").row(0, named=True)
    b128 = u.filter(pl.col("scope") == "batch 128").row(0, named=True)
    assert b1["bound"] == "memory" and b1["dram_read_pct"] > 60 and b1["tensor_active_pct"] < 20
    assert b128["bound"] == "compute" and b128["tensor_active_pct"] > 50
    found = {(f.code, f.phase) for f in findings.find(res)}
    assert ("PHASE_MEMORY_BOUND", "verify (batch 1)") in found
    assert ("PHASE_COMPUTE_BOUND", "verify (batch 128)") in found


def test_short_phase_says_so(res):
    """host_overhead (~1.5 µs) is far shorter than the 50 µs sampling period: no number, a note."""
    row = (utilisation.phases(res).filter(pl.col("rank").is_null() & (pl.col("phase") == "host_overhead")
                                          & (pl.col("scope") == "steady")).row(0, named=True))
    assert row["dram_read_pct"] is None and row["instances"] == 0 and row["short"] > 100
    assert row["note"].startswith("too short for the sampling period")


def test_every_export_format_gives_the_same_numbers(res, capture, tmp_path):
    want = utilisation.phases(res)
    for fmt in ("parquet", "arrow"):
        d = write_export_dir(capture, tmp_path / f"x.{fmt}dir", fmt)
        got = utilisation.phases(api.analyze(str(d)))
        assert_frame_equal(got.select(want.columns), want, check_exact=False, rel_tol=1e-9, abs_tol=1e-9)


def test_cli_tables(capture):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "analyze.cli", "analyze", str(capture), "--table", "gpu_metrics",
                          "--format", "csv"], capture_output=True, text=True, check=True).stdout
    df = pl.read_csv(out.encode())
    assert {"dram_read_pct", "gr_active_pct", "gpc_clock_mhz"} <= set(df["metric"])
    assert set(df.columns) >= {"rank", "phase", "scope", "metric", "mean", "samples"}


# ---- synthetic edge cases -------------------------------------------------------------------------------------


def _samples(rows: list[tuple[int, int, float]], period: int = 100, metric: str = "dram_read_pct"):
    """GpuSamples from (gpu, time, value) rows, each covering [time, next time on its GPU)."""
    df = pl.DataFrame(rows, schema={"gpu": pl.Int64, "start": pl.Int64, "value": pl.Float64}, orient="row").sort(
        "gpu", "start")
    df = df.with_columns(end=pl.col("start").shift(-1).over("gpu").fill_null(pl.col("start") + period),
                         metric=pl.lit(metric)).select("gpu", "start", "end", "metric", "value")
    return gpu_metrics.GpuSamples("x", df, pl.DataFrame({"metric": [metric], "name": ["x"], "unit": ["%"]}), period,
                                  sorted(df["gpu"].unique().to_list()))


def test_time_weighted_by_hand():
    s = _samples([(0, 0, 10), (0, 100, 20), (0, 200, 30), (0, 300, 40)])
    spans = pl.DataFrame({"gpu": [0, 0, 0], "start": [50, 100, 0], "end": [250, 300, 400]})
    got = utilisation.interval_means(spans, s)
    # [50, 250): 50 x 10 + 100 x 20 + 50 x 30 = 4000 over 200 ns; [100, 300): 20 and 30 evenly; all: 25
    assert got["dram_read_pct"].to_list() == [20.0, 25.0, 25.0]
    assert got["samples"].to_list() == [3, 2, 4]
    assert got["sampled_ns"].to_list() == [200, 200, 400]


def test_no_sample_in_a_short_phase():
    s = _samples([(0, 0, 10), (0, 1000, 90)], period=1000)
    spans = pl.DataFrame({"gpu": [0, 0], "start": [400, 5000], "end": [450, 9000]})
    got = utilisation.interval_means(spans, s)
    assert got["short"].to_list() == [True, False]
    assert got["dram_read_pct"].to_list() == [None, None]  # short; after the last sample: unsampled
    assert got["samples"].to_list() == [1, 0]


def test_two_gpus_in_one_process_keep_their_own_samples():
    s = _samples([(0, 0, 10), (0, 100, 10), (1, 0, 80), (1, 100, 80)])
    spans = pl.DataFrame({"gpu": [0, 1], "start": [0, 0], "end": [200, 200]})
    assert utilisation.interval_means(spans, s)["dram_read_pct"].to_list() == [10.0, 80.0]


def test_gpu_of_types():
    types = pl.DataFrame({"typeId": [7, 9], "typeName": ["", ""]})
    assert gpu_metrics._gpu_of_types(types, [0, 1], [0, 1]) == {7: 0, 9: 1}
    named = pl.DataFrame({"typeId": [9], "typeName": ["GPU 1: General Metrics"]})
    assert gpu_metrics._gpu_of_types(named, [0, 1], [0, 1]) == {9: 1}
    one = pl.DataFrame({"typeId": [5], "typeName": [""]})
    assert gpu_metrics._gpu_of_types(one, [0, 1], [0, 1]) == {}  # which of two: not guessed
    assert gpu_metrics._gpu_of_types(one, [0, 1], [1]) == {5: 1}


def test_names_by_meaning():
    assert gpu_metrics.metric_key("DRAM Read Bandwidth [Throughput %]")[0] == "dram_read_pct"
    assert gpu_metrics.metric_key("DRAM Read Throughput [Throughput %]")[0] == "dram_read_pct"
    assert gpu_metrics.metric_key("SM Active [Throughput %]")[0] == "sm_active_pct"
    assert gpu_metrics.metric_key("Tensor Active [Throughput %]")[0] == "tensor_active_pct"
    assert gpu_metrics.metric_key("Compute Warps in Flight [Avg]")[0] == "compute_warps_in_flight_avg"


def _with_samples(src: Path, dest: Path, gpu_rows: dict[int, float], type_name: str | None) -> Path:
    """A copy of ``src`` with one GPU-metrics type per GPU in ``gpu_rows`` (constant DRAM read and tensor values
    every 50 µs over the whole run)."""
    out = dest / "with_samples.sqlite"
    shutil.copyfile(src, out)
    con = sqlite3.connect(out)
    t0, t1 = con.execute("SELECT MIN(start), MAX(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.execute("CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT, "
                "metricId INTEGER, metricName TEXT)")
    con.execute("CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER, "
                "metricId INTEGER, value INTEGER)")
    for gpu, v in gpu_rows.items():
        tid = 1000 + gpu
        name = type_name.format(gpu=gpu) if type_name else ""
        con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, ?, ?, ?, ?)",
                        [(tid, tid, name, 0, "DRAM Read Bandwidth [Throughput %]"),
                         (tid, tid, name, 1, "Tensor Active [Throughput %]")])
        times = range(t0 - 100_000, t1 + 100_000, 50_000)
        con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)",
                        [(t, t, tid, m, val) for t in times for m, val in ((0, v), (1, 100 - v))])
    con.commit()
    con.close()
    return out


def test_metrics_on_one_rank_only(tmp_path):
    """TP=2 capture with samples for GPU 1 only (named "GPU 1"): rank on GPU 1 gets its numbers, the other none."""
    src = _unpack(DATA / "h200_tp2" / "tp2_all.sqlite.xz", tmp_path)
    r = api.analyze(str(_with_samples(src, tmp_path, {1: 70}, "GPU {gpu}: General Metrics")))
    u = utilisation.phases(r).filter(pl.col("rank").is_not_null() & (pl.col("instances") > 0))
    dev = dict(r.ranks.select("rank", "device").rows())
    assert u.height and {dev[k] for k in u["rank"].unique()} == {1}
    assert u["dram_read_pct"].to_list() == pytest.approx([70.0] * u.height)


def test_two_gpus_each_rank_its_own(tmp_path):
    src = _unpack(DATA / "h200_tp2" / "tp2_all.sqlite.xz", tmp_path)
    r = api.analyze(str(_with_samples(src, tmp_path, {0: 20, 1: 70}, None)))  # unnamed: by order of the GPUs
    u = utilisation.phases(r).filter(pl.col("rank").is_not_null() & (pl.col("instances") > 0))
    dev = dict(r.ranks.select("rank", "device").rows())
    got = {dev[k]: v for k, v in u.group_by("rank").agg(pl.col("dram_read_pct").mean()).rows()}
    assert got == pytest.approx({0: 20.0, 1: 70.0})


def test_absent_metrics_give_nothing(tmp_path):
    src = _unpack(DATA / "h200_tp1" / "tp1_graph.sqlite.xz", tmp_path)
    r = api.analyze(str(src))
    assert gpu_metrics.read(src) is None
    assert utilisation.phases(r).height == 0 and utilisation.seams(r).height == 0
    assert not [f for f in findings.find(r) if f.code.startswith("PHASE_") and f.code.endswith("_BOUND")]


def test_whatif_uses_the_measured_bound_as_its_prior(res, capture):
    import dataclasses

    from analyze.compute import whatif, whatif_fit

    m = whatif_fit.fit(res, steps_now=3)
    assert m.verify_source == "gpu_metrics" and "PRIOR" in m.verify_text() and "PRIOR" in " ".join(m.assumptions())
    v = utilisation.phases(res).filter(pl.col("rank").is_null() & (pl.col("scope") == "steady")
                                       & (pl.col("phase") == "verify")).row(0, named=True)
    assert m.verify_per_token_ns == pytest.approx(m.cost_ns["verify"] * v["tensor_active_pct"] / 100 / 4)
    assert whatif.to_dict(m)["model"]["verify_prior"]["bound"] == v["bound"]
    # batch 1 alone: memory-bound verify, its extra tokens nearly free (a few % of the compute-bound slope)
    one = whatif_fit.fit(dataclasses.replace(res, cycle_choice=CycleChoice(segment=0)), steps_now=3)
    big = whatif_fit.fit(dataclasses.replace(res, cycle_choice=CycleChoice(segment=2)), steps_now=3)
    assert one.verify_prior["bound"] == "memory" and big.verify_prior["bound"] == "compute"
    assert one.verify_per_token_ns < 0.1 * big.verify_per_token_ns


def test_whatif_without_samples_still_says_assumed(tmp_path):
    from analyze.compute import whatif_fit

    src = _unpack(DATA / "h200_tp1" / "tp1_graph.sqlite.xz", tmp_path)
    m = whatif_fit.fit(api.analyze(str(src)))
    assert m.verify_source == "assumed" and m.verify_per_token_ns == 0 and "ASSUMED" in m.verify_text()


def test_html_section(res, tmp_path):
    from analyze.output import html as page

    sec = page.utilisation_section(res)
    assert sec is not None and sec.id == "utilisation"
    assert sec.body.count("<tr>") == 1 + utilisation.phases(res).filter(
        pl.col("rank").is_null() & (pl.col("scope") != "all")).height
    assert "memory" in sec.body and "compute" in sec.body and "too short" in sec.body
    out = page.write_page(res, tmp_path / "rep")
    assert '<section id="utilisation">' in out.read_text()
    assert page.utilisation_section(api.analyze(str(_unpack(DATA / "h200_tp1" / "tp1_graph.sqlite.xz", tmp_path)))) \
        is None


def test_utilisation_figure(res):
    from analyze.output import plots

    fig = plots.utilisation_bars(res)
    rows = utilisation.phases(res).filter(pl.col("rank").is_null() & (pl.col("scope") != "all")
                                          & (pl.col("instances") > 0)).height
    (ax,) = fig.axes
    assert len(ax.patches) == 5 * rows and len(ax.get_yticklabels()) == rows
    assert any("memory-bound" in t.get_text() for t in ax.get_yticklabels())
    fig.savefig(__import__("io").BytesIO(), format="png")


def test_bound_thresholds():
    df = pl.DataFrame({"sm_active_pct": [80.0, 80.0, 80.0, 80.0, 5.0, None],
                       "sm_issue_pct": [10.0, 10.0, 70.0, 10.0, 1.0, None],
                       "tensor_active_pct": [20.0, 50.0, 10.0, 30.0, 1.0, None],
                       "dram_read_pct": [60.0, 59.9, 30.0, 40.0, 1.0, 80.0]})
    assert df.select(bound=utilisation.bound_expr())["bound"].to_list() == [
        "memory", "compute", "compute", "mixed", "idle", None]
