"""What-if model on a hand-computed synthetic trace (tests/eagle_synth.py)."""

from __future__ import annotations

import json

import eagle_synth as es
import pytest

from analyze import analyze
from analyze.cli import main
from analyze.compute.whatif import fit, solve_alpha, validate
from analyze.model import InputError


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
    assert m.verify_per_token_ns == 0 and m.batch_size == 2 and m.accepted_now == 1.5


def test_alpha_and_predictions(traces):
    m = fit(traces[0])
    a = m.alpha
    assert a + a**2 + a**3 == pytest.approx(1.5, abs=1e-9)
    p1 = m.predict(1)
    tok1 = 2 * (1 + a)
    assert p1["tokens_per_cycle"] == pytest.approx(tok1)
    # draft 700/3; verify flat; extend 225 + 25 (tok1 − 5). Seams are launch-bound: verify's first launch is
    # 100 ns after draft's first GPU op, its smallest launch→GPU latency 1400 ns → ready 1500, seam
    # max(400, 1500 − draft): 800 now, 1500 − 700/3 at 1 step; verify→extend: ready −400 + 3500 < 3000 → floor
    # 100. other = 10 000 − 700 − 3000 − 225 − 800 − 100 = 5175.
    assert m.ready["draft→verify"] == 1500 and m.seam_floor["draft→verify"] == 400
    assert m.seams(3) == {"draft→verify": 800, "verify→draft_extend": 100}
    assert m.other_ns == 5175
    assert p1["cycle_ns"] == pytest.approx(700 / 3 + 3000 + 225 + 25 * (tok1 - 5) + (1500 - 700 / 3) + 100 + 5175)
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
    """SGLang v2 (issue 17): the accept lengths arrive in ``accept`` marks, one cycle late; the what-if fits the
    same α and extend slope from them as from the range payload."""
    m = fit(analyze(es.eagle(tmp_path / "v2.sqlite", prefix="eagle3.", accept_on="mark")))
    ref = fit(traces[0])
    assert m.accepted_now == 1.5 and m.alpha == ref.alpha
    assert m.extend_per_token_ns == pytest.approx(25) and m.predictions() == ref.predictions()
