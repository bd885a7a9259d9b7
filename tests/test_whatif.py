"""What-if model on a hand-computed synthetic trace (tests/helpers/eagle_synth.py)."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import polars as pl
import pytest

from analyze import analyze
from analyze.cli import main
from analyze.compute.whatif import Replay, fit, solve_alpha, validate
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
    assert p1["tokens_per_cycle"] == pytest.approx(tok1)
    # The replay: every launch call of this trace is at a fixed host time (no sync), and each
    # cycle's draft launch (B + 200, returns at B + 250) finds the GPU idle: the draft starts 750 ns after
    # it, every cycle, so the period stays 10 000 whatever the phases cost. Inside the cycle the GPU is
    # the bound: verify starts at draft end + 400 (rank 0) / 800 (rank 1), draft_extend 100 after verify,
    # host_overhead 1400 − E after draft_extend (E = 150, 200, 250 in the 3 replayed cycles), at 1 step too.
    assert p1["cycle_ns"] == pytest.approx(10_000)
    seams = {"draft→verify": 600, "verify→draft_extend": 100, "draft_extend→host_overhead": 1200}
    assert m.seams(3) == pytest.approx(seams) and m.seams(1) == pytest.approx(seams)
    # seams per cycle: 500 + 1400 − E (rank 0) and 900 + 1400 − E (rank 1): median (1750 + 2050) / 2;
    # other = 10 000 − 700 − 3000 − 225 − 1900
    assert m.seams_total(3) == 1900 and m.other_ns == 4175
    assert m.predict(3)["cycle_ns"] == pytest.approx(10_000) and m.predict(3)["measured"]
    assert p1["tokens_per_s"] == pytest.approx(tok1 / p1["cycle_ns"] * 1e9)


def test_baseline_sets_verify_slope(traces):
    m = fit(traces[0], baseline=traces[1])
    assert m.verify_per_token_ns == pytest.approx((3000 - 1500) / 3)
    assert m.predict(1)["verify_ns"] == pytest.approx(2000) and m.predict(6)["verify_ns"] == pytest.approx(4500)


def test_best_is_argmax_tokens_per_s(traces):
    m = fit(traces[0], baseline=traces[1])
    preds = m.predictions()
    assert m.best()["steps"] == max(preds, key=lambda p: p["tokens_per_s"])["steps"]


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
    assert m.period_ns == 2000 and m.predict(3)["measured"]
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
