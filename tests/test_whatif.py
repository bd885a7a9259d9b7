"""What-if model on a hand-computed synthetic trace (tests/helpers/eagle_synth.py)."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import polars as pl
import pytest

from analyze import analyze
from analyze.cli import main
from analyze.compute.whatif import validate
from analyze.compute.whatif_fit import fit, solve_alpha
from analyze.compute.whatif_replay import Replay
from analyze.model import InputError
from tests.helpers import eagle_synth as es


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("wi")
    return analyze(es.eagle(d / "e.sqlite", prefix="eagle3.")), analyze(es.baseline(d / "b.sqlite")), d


def test_costs(traces):
    m = fit(traces[0])
    assert m.steps_now == 3  # from the manifest
    # min over ranks per cycle: draft 700 (rank 1 does not wait); verify 3000; extend median(150..300) = 225
    assert m.cost_ns == {"draft": 700, "verify": 3000, "draft_extend": 225}
    assert m.period_ns == 10_000
    assert m.extend_per_token_ns == pytest.approx(25)  # E = 100 + 25 · tokens
    # accepted per request over the cycles with a period (1..3): (2 + 4 + 6) / 2 / 3
    assert m.verify_per_token_ns == 0 and m.batch_size == 2 and m.accepted_now == 2.0


def test_alpha_and_predictions(traces):
    m = fit(traces[0])
    a = m.alpha
    assert a + a**2 + a**3 == pytest.approx(2.0, abs=1e-9)
    p1 = m.predict(1)
    tok1 = 2 * (1 + a)
    assert p1.tokens_per_cycle == pytest.approx(tok1)
    # The replay: every launch call of this trace is at a fixed host time (no sync), and each
    # cycle's draft launch (B + 200, returns at B + 250) finds the GPU idle: the draft starts 750 ns after
    # it, every cycle, so the period stays 10 000 whatever the phases cost. Inside the cycle the GPU is
    # the bound: verify starts at draft end + 400 (rank 0) / 800 (rank 1), draft_extend 100 after verify,
    # host_overhead 1400 − E after draft_extend (E = 150, 200, 250 in the 3 replayed cycles), at 1 step too.
    assert p1.cycle_ns == pytest.approx(10_000)
    seams = {"draft→verify": 600, "verify→draft_extend": 100, "draft_extend→host_overhead": 1200}
    assert m.seams(3) == pytest.approx(seams) and m.seams(1) == pytest.approx(seams)
    # seams per cycle: 500 + 1400 − E (rank 0) and 900 + 1400 − E (rank 1): median (1750 + 2050) / 2;
    # other = 10 000 − 700 − 3000 − 225 − 1900
    assert m.seams_total(3) == 1900 and m.other_ns == 4175
    assert m.predict(3).cycle_ns == pytest.approx(10_000) and m.predict(3).measured
    assert p1.tokens_per_s == pytest.approx(tok1 / p1.cycle_ns * 1e9)


def test_baseline_sets_verify_slope(traces):
    m = fit(traces[0], baseline=traces[1])
    assert m.verify_per_token_ns == pytest.approx((3000 - 1500) / 3)
    assert m.predict(1).verify_ns == pytest.approx(2000) and m.predict(6).verify_ns == pytest.approx(4500)


def test_best_is_argmax_tokens_per_s(traces):
    m = fit(traces[0], baseline=traces[1])
    preds = m.predictions()
    assert m.best().steps == max(preds, key=lambda p: p.tokens_per_s).steps


def test_solve_alpha_edges():
    assert solve_alpha(0, 3) == 0 and solve_alpha(3, 3) == 1
    assert solve_alpha(0.5, 1) == pytest.approx(0.5)


def test_steps_needed(tmp_path):
    res = analyze(es.eagle(tmp_path / "x.sqlite", manifest=False))
    with pytest.raises(InputError, match="--steps-now"):
        fit(res)
    assert fit(res, steps_now=3).cost_ns["draft"] == 700


def test_validate_on_own_trace(traces):
    v = validate({3: traces[0]})
    assert v.height == 1 and v["error_pct"][0] == pytest.approx(0)


def test_cli(traces, capsys):
    d = traces[2]
    assert main(["whatif", str(d / "e.sqlite"), "--format", "json", "--baseline", str(d / "b.sqlite")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["steps"] for p in doc["predictions"]] == list(range(1, 11))
    assert doc["predictions"][2]["cycle_ns"] == pytest.approx(10_000) and doc["best"] is not None
    assert main(["whatif", str(d / "b.sqlite")]) == 2  # a baseline has no cycles to model
    assert main(["whatif", str(d / "e.sqlite"), "--acceptance", "1.5"]) == 2
    assert main(["whatif", str(d / "e.sqlite"), "--acceptance", "0.5", "--max-steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "α = 0.500" in out and "best:" in out


def test_acceptance_from_v2_accept_marks(tmp_path, traces):
    """SGLang v2: the accept lengths arrive in ``accept`` marks, one cycle late; the what-if fits the
    same α and extend slope from them as from the range payload."""
    m = fit(analyze(es.eagle(tmp_path / "v2.sqlite", prefix="eagle3.", accept_on="mark")))
    ref = fit(traces[0])
    assert m.accepted_now == 2.0 and m.alpha == ref.alpha
    assert m.extend_per_token_ns == pytest.approx(25) and m.predictions() == ref.predictions()
@pytest.fixture(scope="module")
def chained(tmp_path_factory):
    d = tmp_path_factory.mktemp("chain")
    return {m: analyze(es.chained(d / f"{m}.sqlite", m)) for m in ("Node", "Graph")}


def test_replay_moves_the_gpu_bound_chain(chained):
    """Graph-mode trace: verify queued behind draft, the host waits for the copy in host_overhead, so a
    shorter draft moves everything after it: 1895 − 200 ns per step fewer (eagle_synth.chained)."""
    m = fit(chained["Graph"])
    assert [m.cycle(s) for s in (1, 2, 3)] == [1695, 1795, 1895]
    assert m.seams(1) == {"draft→verify": 5, "verify→draft_extend": 5, "draft_extend→host_overhead": 5}
    assert m.launch_cut_ns == 0 and fit(chained["Graph"], as_traced=True).cycle(1) == 1695


def test_replay_slow_launch_and_node_tracing_cost(chained):
    """Node-mode trace of the same program: the verify launch takes 400 ns (node tracing) and returns after
    the draft: a slow launch, not a blocked one, so as traced a shorter draft changes nothing (2000); with
    node tracing's launch cost removed ((400 − 20) / (10 − 3) ns per node beyond the draft's 3), the
    verify launch takes 20 ns and the model is the graph-mode program: 1895, 1795, 1695."""
    r = chained["Node"]
    traced = fit(r, as_traced=True)
    assert [traced.cycle(s) for s in (1, 2, 3)] == [2000, 2000, 2000]
    m = fit(r)
    assert m.launch_cut_ns == pytest.approx(380 / 7) and m.launch_cut_from == 3
    assert [m.cycle(s) for s in (1, 2, 3)] == pytest.approx([1695, 1795, 1895])
    assert m.period_ns == 2000 and m.predict(3).measured
    assert any("the model's cycle at 3 steps" in n for n in m.notes)
    seam = r.seams.filter(pl.col("from") == "draft").row(0, named=True)
    assert (seam["bound"], seam["launch_block_ns"]) == ("launch", 5 * 105)
    assert r.seams.filter(pl.col("from") == "cycle")["bound"][0] == "host"
    g = chained["Graph"].seams.filter(pl.col("from") == "draft")["bound"][0]
    assert g == "gpu"


def test_explain(chained, capsys):
    m = fit(chained["Node"])
    text = "\n".join(m.assumptions())
    assert "slow, not blocked" in text and "0.05 µs per graph node" in text
    path = chained["Node"].trace.path
    assert main(["whatif", path, "--explain"]) == 0
    out = capsys.readouterr().out
    assert "Assumptions" in out and "mean change over 4 replayed windows" in out
    assert main(["whatif", path, "--format", "json", "--as-traced"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["launch_cut_per_node_ns"] == 0 and doc["predictions"][0]["cycle_ns"] == 2000
    assert doc["model"]["assumptions"]


def test_merged_reports_replay_per_rank(tmp_path):
    """Two reports merged (one rank each, the same range ids in both): the same model as one of them."""
    paths = [es.chained(tmp_path / f"{n}.sqlite", "Graph") for n in ("a", "b")]
    con = sqlite3.connect(paths[1])  # two files, not byte-identical copies of one (refused: DUPLICATE_REPORT)
    con.execute("PRAGMA user_version = 1")
    con.close()
    m = fit(analyze(paths, jobs=1))
    assert m.cost_ns == {"draft": 300, "verify": 1000, "draft_extend": 100}
    assert [m.cycle(s) for s in (1, 3)] == [1695, 1895] and m.replay.windows == 8


def _one_window(wait: int, own: float = 0, rho: float = 50) -> Replay:
    """A window of three key calls (ns): a 3-node draft graph launch [0, 20] (GPU [25, 325]); a sync
    [100, 400] waiting for GPU work ending at 350 (= draft end + 25), either as traced (wait -1: launched
    before the window) or on slot 0's phase; 80 ns of host time before it, in which a 10-node graph was
    launched; the next cycle's draft launch [450, 470] (GPU at 475): period 450. The sync returns at
    max(start + ``own``, the work's end + ``rho``)."""
    nan = np.nan
    cols = {"s": [0, 100, 450], "e": [20, 400, 470], "sync": [False, True, False], "has_unit": [True, False, True],
            "code": [0, -1, 0], "launch_latency": [5, nan, 5], "device_gap": [5, nan, 5], "gpu_span": [300, nan, 300], "pred": [-1, -1, 0],
            "pred_gpu_last": [nan, nan, nan], "wait": [-1, wait, -1], "w_off": [0, 25, 0], "w_ext": [nan, 325, nan],
            "own_time": [nan, own, nan], "return_latency": [nan, rho, nan], "trans": [-1, -1, -1], "nodes": [3, 0, 3],
            "graph": [True, False, True], "gap_nodes": [0, 10, 0], "gap_launches": [0, 1, 0]}
    a = {k: np.array([v], dtype=bool if k in ("sync", "has_unit", "graph") else
                     (np.int64 if k in ("code", "pred", "wait", "trans") else float)) for k, v in cols.items()}
    return Replay(np.array([0]), np.array([450.0]), np.array([3]), a, [], np.zeros(0))


def test_replay_mechanics():
    ext, own = _one_window(-1), _one_window(0)
    for r in (ext, own):
        assert r.run({})[0][0] == 450  # the trace, unchanged
    # 2 ns per node beyond 3 off the 10-node launch in the gap: the sync starts 14 ns earlier; waiting, it still
    # returns at 400; host-bound (300 ns of its own, the work done at 350), it returns 14 ns earlier
    assert ext.run({}, (2.0, 3))[0][0] == 450
    host = _one_window(-1, own=300, rho=0)
    assert host.run({})[0][0] == 450 and host.run({}, (2.0, 3))[0][0] == 436
    # a draft 100 ns shorter: a sync waiting on work launched before the window does not move; one waiting on
    # the draft returns 100 ns earlier, and the next cycle's launch (host-bound) with it
    assert ext.run({"draft": -100})[0][0] == 450
    assert own.run({"draft": -100})[0][0] == 350


@pytest.mark.parametrize("name,steps", [("tp1_steps2", 2), ("tp1_steps3", 3), ("tp1_steps4", 4),
                                        ("tp1_serve_node", 3)])
def test_steps_inferred_without_a_manifest(tmp_path, name, steps):
    """Without a manifest, the draft step count comes from the draft phase's repeated structure; checked
    against the manifest each bundled H200 capture was recorded with (left out of the copy analysed here)."""
    import lzma
    import shutil
    from pathlib import Path

    src = Path(__file__).parent / "data" / "h200_tp1"
    assert json.loads((src / f"{name}.manifest.json").read_text())["speculative"]["steps"] == steps
    out = tmp_path / f"{name}.sqlite"
    with lzma.open(src / f"{name}.sqlite.xz") as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g)
    m = fit(analyze(out))
    assert m.steps_now == steps and m.steps_source.startswith(f"inferred: the draft phase's GPU work repeats {steps}")
    assert fit(analyze(out), steps_now=steps + 1).steps_source == "given"


def test_whatif_text_says_how_steps_and_acceptance_are_known(tmp_path, capsys):
    e = es.eagle(tmp_path / "e.sqlite")
    assert main(["whatif", str(e), "--acceptance", "0.7"]) == 0
    out = capsys.readouterr().out
    assert "acceptance: α = 0.700, given (--acceptance), not measured" in out and "given accepted" not in out
    assert "\ndraft steps: 3, the manifest's speculative.steps\n" in out
    assert main(["whatif", str(e), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["model"]
    assert doc["steps_source"] == "the manifest's speculative.steps" and doc["steps_now"] == 3
    assert main(["whatif", str(e)]) == 0
    assert "accepted draft tokens/request/cycle (measured) → α =" in capsys.readouterr().out


def _reference_run(r: Replay, delta: dict[str, float], cut: tuple[float, int] = (0.0, 0)):
    """Replay.run as first written: window-major (windows, slots) arrays, each slot's column gathered in place."""
    a, n_w = r.a, r.windows
    k_max = a["s"].shape[1]
    d = np.array([delta.get(p, 0.0) for p in ("draft", "verify", "draft_extend")] + [0.0])
    g = np.maximum(a["gpu_span"] + d[a["code"]], 0.0)
    dur = np.maximum(a["e"] - a["s"] - np.where(a["graph"], cut[0] * np.maximum(a["nodes"] - cut[1], 0.0), 0.0), 0.0)
    e_, s_gpu, a_gpu = (np.full((n_w, k_max), np.nan) for _ in range(3))
    rows = np.arange(n_w)

    def at(arr, ref, ext):
        return np.where(ref >= 0, arr[rows, np.maximum(ref, 0)], ext)

    for k in range(k_max):
        if k == 0:
            sk = a["s"][:, 0]
        else:
            traced = cut[0] * (a["gap_nodes"][:, k] - cut[1] * a["gap_launches"][:, k])
            sk = e_[:, k - 1] + np.maximum(a["s"][:, k] - a["e"][:, k - 1] - traced, 0.0)
        plain = sk + dur[:, k]
        sync = a["sync"][:, k]
        sub = np.where(sync, sk, plain)
        after_pred = at(a_gpu, a["pred"][:, k], a["pred_gpu_last"][:, k]) + a["device_gap"][:, k]
        start = np.fmax(sub + a["launch_latency"][:, k], after_pred)
        unit = a["has_unit"][:, k]
        s_gpu[:, k] = np.where(unit, start, np.nan)
        a_gpu[:, k] = np.where(unit, start + g[:, k], np.nan)
        waited = at(a_gpu, a["wait"][:, k], a["w_ext"][:, k]) + a["w_off"][:, k]
        e_[:, k] = np.where(sync, np.fmax(sk + a["own_time"][:, k], waited + a["return_latency"][:, k]), plain)
    period = s_gpu[rows, r.n_items - 1] - s_gpu[:, 0]
    pred = np.where(a["pred"] >= 0, a_gpu[rows[:, None], np.maximum(a["pred"], 0)], np.nan)
    gap = np.where(a["trans"] >= 0, s_gpu - pred, np.nan)
    return period, np.nansum(np.maximum(gap, 0.0), axis=1), gap


def _random_replay(rng: np.random.Generator, n_w: int, k_max: int) -> Replay:
    n_items = rng.integers(1, k_max + 1, n_w)
    n_items[0] = k_max
    pad = np.arange(k_max)[None, :] >= n_items[:, None]
    s = np.cumsum(rng.uniform(0, 500, (n_w, k_max)), axis=1)
    a: dict[str, np.ndarray] = {"s": s, "e": s + rng.uniform(0, 200, (n_w, k_max))}
    for c in ("launch_latency", "device_gap", "gpu_span", "pred_gpu_last", "w_off", "w_ext", "own_time",
              "return_latency", "nodes", "gap_nodes", "gap_launches"):
        a[c] = np.round(rng.uniform(0, 400, (n_w, k_max)), rng.integers(0, 3))
    for c in ("sync", "has_unit", "graph"):
        a[c] = rng.random((n_w, k_max)) < 0.5
    a["code"] = rng.integers(-1, 3, (n_w, k_max))
    slot = np.arange(k_max)[None, :]
    for c in ("pred", "wait"):  # an earlier slot of the window, or -1 (before the window)
        a[c] = np.where(rng.random((n_w, k_max)) < 0.3, -1, (rng.random((n_w, k_max)) * slot).astype(np.int64))
    a["trans"] = rng.integers(-1, 4, (n_w, k_max))
    for v in a.values():  # the slots past a window's calls padded as _build_replay pads them
        v[pad] = False if v.dtype == bool else (-1 if v.dtype == np.int64 else np.nan)
    return Replay(np.zeros(n_w, np.int64), rng.uniform(1e3, 2e3, n_w), n_items, a, ["a→b", "b→c", "c→d", "d→a"],
                  np.zeros(0))


def test_replay_run_equals_the_window_by_window_reference(traces):
    """Replay.run (slot-major, what does not change with the deltas worked out once per cut) gives exactly the
    numbers of the window-major replay it replaced: on random windows of up to 12 slots (NaN padding, syncs,
    references before the window, graph launches) and on a fitted model's replay, for several deltas and cuts."""
    rng = np.random.default_rng(7)
    cases = [_random_replay(rng, n_w, k) for n_w, k in ((1, 1), (50, 3), (400, 12))]
    cases.append(fit(traces[0]).replay)
    for r in cases:
        for cut in ((0.0, 0), (37.5, 2), (1.25, 0), (37.5, 2)):
            for delta in ({}, {"draft": -120.5, "verify": 300.0}, {"draft_extend": 1e4, "verify": -5e3}):
                got, want = r.run(delta, cut), _reference_run(r, delta, cut)
                for x, y in zip(got, want, strict=True):
                    assert x.shape == y.shape and x.flags.c_contiguous
                    assert np.array_equal(x, y, equal_nan=True)
        r.let_go()
        assert "_slots_memo" not in r.__dict__


def test_replay_built_once_whoever_asks_first(traces, monkeypatch):
    """The replay table: one build per result and cycle choice, a second thread asking meanwhile waits for it (the
    JSON document builds it while the findings' fit asks for it); a failed build fails both and is not kept;
    will_replay only when fitted() will fit (not fitted yet, step count known)."""
    import dataclasses
    import threading

    from analyze.compute import whatif, whatif_replay

    res = dataclasses.replace(traces[0])
    builds: list[int] = []
    started, go = threading.Event(), threading.Event()
    real = whatif_replay._build_replay

    def slow(r):
        builds.append(1)
        started.set()
        go.wait(10)
        return real(r)

    monkeypatch.setattr(whatif_replay, "_build_replay", slow)
    got: list = []
    t = threading.Thread(target=lambda: got.append(whatif_replay.replay(res)))
    t.start()
    started.wait(10)
    other = threading.Thread(target=lambda: got.append(whatif_replay.replay(res)))
    other.start()  # asks while the first builds: waits
    go.set()
    t.join()
    other.join()
    assert len(builds) == 1 and got[0] is got[1] and whatif_replay.replay(res) is got[0]
    assert fit(res).replay is got[0] and len(builds) == 1
    want = real(res)
    assert np.array_equal(got[0].period, want.period) and got[0].labels == want.labels

    fresh = dataclasses.replace(traces[0])
    monkeypatch.setattr(whatif_replay, "_build_replay", lambda r: (_ for _ in ()).throw(RuntimeError("broken")))
    for _ in range(2):  # not kept: the next caller builds it again
        with pytest.raises(RuntimeError, match="broken"):
            whatif_replay.replay(fresh)
    monkeypatch.setattr(whatif_replay, "_build_replay", slow)
    builds.clear()
    whatif.fitted(fresh)
    assert not whatif.will_replay(fresh)  # fitted already: nothing to build
    assert len(builds) == 1
    ahead = dataclasses.replace(traces[0])
    assert whatif.will_replay(ahead)
    whatif_replay.replay(ahead)
    assert len(builds) == 2 and whatif.fitted(ahead).replay is whatif_replay.replay(ahead) and len(builds) == 2
    monkeypatch.setattr(whatif, "steps_known", lambda r, s: (_ for _ in ()).throw(InputError("no steps", "NO_STEPS")))
    assert not whatif.will_replay(dataclasses.replace(traces[0]))  # the fit would not get that far
    assert len(builds) == 2


def _same_replay(a: Replay, b: Replay) -> bool:
    return (np.array_equal(a.rank, b.rank) and np.array_equal(a.period, b.period) and np.array_equal(a.n_items, b.n_items)
            and a.labels == b.labels and np.array_equal(a.rest, b.rest) and a.defaults == b.defaults
            and a.a.keys() == b.a.keys()
            and all(a.a[k].dtype == b.a[k].dtype and a.a[k].flags.c_contiguous
                    and np.array_equal(a.a[k], b.a[k], equal_nan=a.a[k].dtype.kind == "f") for k in a.a))


def test_replay_built_on_packed_keys_as_on_two_columns(traces, tmp_path, monkeypatch):
    """_build_replay qualifies range ids by rank and looks up each slot's predecessor and awaited slot on (window,
    range id), each packed into one integer (analyze.read.packed_keys): the same arrays as without packing (KEYS 0:
    a string id, two-column joins) on a trace, a node-level chain and two merged reports."""
    from analyze.compute import whatif_replay
    from analyze.read import packed_keys

    paths = [es.chained(tmp_path / f"{n}.sqlite", "Graph") for n in ("a", "b")]
    con = sqlite3.connect(paths[1])
    con.execute("PRAGMA user_version = 1")
    con.close()
    results = [traces[0], analyze(es.chained(tmp_path / "n.sqlite", "Node")), analyze(paths, jobs=1)]
    for res in results:
        packed = whatif_replay._build_replay(res)
        monkeypatch.setattr(packed_keys, "KEYS", 0)
        columns = whatif_replay._build_replay(res)
        monkeypatch.undo()
        assert packed.windows > 0 and _same_replay(packed, columns)


def test_same_rank_is_a_shift_over_rank():
    """_same_rank(by) masking a shift on rows sorted by rank is the shift over each rank (nulls one rank too)."""
    from analyze.compute.whatif_replay import _same_rank

    rng = np.random.default_rng(3)
    rank = rng.integers(0, 4, 300).astype(float)
    rank[rng.random(300) < 0.1] = np.nan
    df = (pl.DataFrame({"rank": rank, "x": rng.integers(0, 100, 300)}).with_columns(pl.col("rank").fill_nan(None).cast(pl.Int64))
          .sort("rank", "x"))
    for by in (1, -1):
        got = df.select(pl.when(_same_rank(by)).then(pl.col("x").shift(by)))["x"]
        assert got.equals(df.select(pl.col("x").shift(by).over("rank"))["x"])
    assert pl.DataFrame({"rank": [1], "x": [5]}).select(pl.when(_same_rank(1)).then(pl.col("x").shift(1)))["x"].to_list() == [None]


def test_seam_slots_pick_what_the_mask_picks():
    """Replay.seam_slots: each seam's places in the flat arrays, in the order a boolean mask gives them."""
    rng = np.random.default_rng(11)
    r = _random_replay(rng, 300, 9)
    r.a["trans"] = rng.integers(-1, 3, r.a["trans"].shape)
    r.labels = ["a", "b", "c", "never"]
    gap = rng.normal(size=r.a["trans"].shape)
    at = r.seam_slots()
    assert list(at) == ["a", "b", "c"]
    for i, lab in enumerate(r.labels[:3]):
        assert np.array_equal(gap.reshape(-1)[at[lab]], gap[r.a["trans"] == i])
    r.let_go()
    assert "_seam_slots" not in r.__dict__ and "_seam_slots" not in r.__getstate__()
