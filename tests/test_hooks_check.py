"""``spectrace hooks check``: static AST verification against the real SGLang wheels and broken fakes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from analyze.cli import main
from nvtx_hooks import check
from nvtx_hooks.check import FetchError, check_tree, detect_version, fetch_sglang
from nvtx_hooks.targets import parse_version, supported, targets_for

FAKE = Path(__file__).parent / "fake_sglang"
VERSIONS = ["0.4.6", "0.4.10.post2", "0.5.3", "0.5.4", "0.5.5", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.23"]


@pytest.fixture(scope="module")
def real():
    """Fetch (once, cached) the wheel sources; skip with the reason when PyPI is unreachable."""
    roots: dict[str, Path] = {}

    def get(v: str) -> Path:
        if v not in roots:
            try:
                roots[v] = fetch_sglang(v)
            except FetchError as e:
                pytest.skip(f"cannot fetch sglang=={v} from PyPI (offline?): {e}")
        return roots[v]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_real_sources_pass(real, version, capsys):
    root = real(version)
    assert detect_version(root) == version
    rep = check_tree(root)
    assert rep.ok, "\n".join(rep.lines())
    assert main(["hooks", "check", "--sglang-root", str(root)]) == 0
    assert f"SGLang {version}" in capsys.readouterr().out


@pytest.mark.slow
def test_real_sources_facts(real):
    """What the table relies on, as found in the wheels."""

    def found(v):
        return {f.what: f for f in check_tree(real(v)).findings}

    old, new = found("0.4.6"), found("0.5.3")
    assert "sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_speculative_generation" in old
    assert "sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_generation" in new
    v13 = found("0.5.13")
    assert not any(".eagle_worker.EAGLEWorker" in w for w in v13)  # v1 removed in 0.5.13
    v23 = found("0.5.23")
    assert v23["sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch"].status == "ok"


# Where a v2 decode batch's accept lengths first reach the host (``accept_lens.tolist()`` after SGLang's own
# ``copy_done.synchronize()``), and the host int the ``accept`` mark reads, per version.
MIXIN = "sglang.srt.managers.scheduler_output_processor_mixin.SchedulerOutputProcessorMixin."
RESULTS = "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor."
# The per-request host list the accept_histogram marks come from (None: SGLang keeps it in a local there).
ACCEPT_SITES = {
    "0.5.4": (MIXIN + "_resolve_spec_overlap_token_ids", 229, "num_accepted_tokens", None),
    "0.5.5": (MIXIN + "_resolve_spec_overlap_token_ids", 259, "num_accepted_tokens", None),
    "0.5.10": (MIXIN + "_resolve_spec_overlap_token_ids", 334, "num_accepted_tokens", "accept_length_per_req_cpu"),
    "0.5.11": (MIXIN + "_resolve_spec_overlap_token_ids", 356, "num_accepted_drafts",
               "num_accepted_drafts_per_req_cpu"),
    "0.5.12": (MIXIN + "_resolve_spec_overlap_tokens", 409, "num_correct_drafts", "num_correct_drafts_per_req_cpu"),
    "0.5.13": (RESULTS + "_resolve_spec_v2_tokens", 527, "num_correct_drafts", "num_correct_drafts_per_req_cpu"),
    "0.5.23": (RESULTS + "_resolve_spec_v2_tokens", 770, "num_correct_drafts", "num_correct_drafts_per_req_cpu"),
}


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(ACCEPT_SITES))
def test_real_sources_accept_site(real, version):
    what, line, attr, per = ACCEPT_SITES[version]
    f = {f.what: f for f in check_tree(real(version)).findings}[what]
    hist = f", accept_histogram from {per}" if per else " (no per-request list: no accept_histogram)"
    assert (f.status, f.line, f.detail) == ("ok", line, f"mark accept reads {attr}{hist}")
    for old in ("0.4.6", "0.5.3"):  # v1 only: no accept target before the v2 worker exists
        assert not any("result_processor" in w or "output_processor" in w for w in
                       (x.what for x in check_tree(real(old)).findings))


@pytest.mark.slow
def test_real_source_outside_range_is_unsupported(real, capsys):
    root = real("0.5.23")
    rep = check_tree(root, "0.6.0")
    assert rep.unsupported and not rep.ok
    assert main(["hooks", "check", "--sglang-root", str(root), "--version", "0.6.0"]) == 1


# Where the scheduler's loop methods are, per version (the host ranges scheduler.<method>).
SCHED = "sglang.srt.managers.scheduler.Scheduler."
RECV = "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver.recv_requests"
SCHEDULER_SITES = {
    "0.4.6": {SCHED + "recv_requests": 675, SCHED + "run_batch": 1354, SCHED + "process_batch_result": 1416},
    "0.5.12": {SCHED + "recv_requests": 1656, SCHED + "get_next_batch_to_run": 2485, SCHED + "run_batch": 2996},
    "0.5.13": {RECV: 70, SCHED + "process_input_requests": 1539, SCHED + "process_batch_result": 3212},
    "0.5.23": {RECV: 80, SCHED + "process_input_requests": 2224, SCHED + "get_next_batch_to_run": 3894,
               SCHED + "run_batch": 4614, SCHED + "process_batch_result": 5074},
}


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(SCHEDULER_SITES))
def test_real_sources_scheduler_sites(real, version):
    found = {f.what: f for f in check_tree(real(version)).findings}
    for what, line in SCHEDULER_SITES[version].items():
        f = found[what]
        assert (f.status, f.line) == ("ok", line) and f.detail.startswith("host range scheduler."), f
    assert sum(f.detail.startswith("host range") for f in found.values()) == 5  # all five, in every version


@pytest.mark.slow
def test_real_0523_steps_and_layout(real, capsys):
    """0.5.23 as released: the worker-step layout; the entry's steps are the adaptive route (checked: the step
    activates them, the controller's activation is the policy's get_steps_for_batch); the DP coordination path."""
    rep = check_tree(real("0.5.23"))
    assert rep.ok and rep.layout == "worker-step"
    found = {f.what: f for f in rep.findings}
    v2 = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2."
    assert found[v2 + "forward_batch_generation"].detail == "range cycle|prefill, steps: the adaptive route of the " \
                                                             "batch size"
    assert found[v2 + "verify"].status == "ok"
    assert found[v2 + "_forward_dp_spec_prefill_coordination"].line == 1604
    ctl = found["sglang.srt.speculative.adaptive_runtime_state.AdaptiveController.activate_step_by_batch"]
    assert (ctl.status, ctl.line) == ("ok", 122) and "get_steps_for_batch" in ctl.detail
    assert main(["hooks", "check", "--sglang-root", str(real("0.5.23"))]) == 0
    assert "layout: worker-step" in capsys.readouterr().out
    old = {f.what: f for f in check_tree(real("0.5.12")).findings}
    assert "steps: the worker's speculative_num_steps" in old[v2 + "forward_batch_generation"].detail


@pytest.mark.slow
def test_real_0523_with_the_31499_refactor(real, tmp_path, capsys):
    """The real 0.5.23 tree rewritten into #31499's shape: hooks check names the layout, checks run_eagle_verify
    (the module function) instead of the vanished EAGLEWorkerV2.verify, and what the shared step must call."""
    from tests.helpers import refactor_31499

    root = tmp_path / "tree"
    shutil.copytree(real("0.5.23"), root)
    refactor_31499.apply(root)
    rep = check_tree(root)
    assert rep.ok, "\n".join(rep.lines())
    assert rep.layout == "shared-step"
    found = {f.what: f for f in rep.findings}
    common = "sglang.srt.speculative.eagle_worker_common."
    assert found[common + "run_eagle_verify"].detail == "range verify"
    assert {f.detail for w, f in found.items() if w == common + "eagle_forward_generation"} <= {
        "calls run_eagle_verify (relied on, not patched)", "calls activate_step_by_batch (relied on, not patched)"}
    assert not any(w.endswith("EAGLEWorkerV2.verify") for w in found)
    assert main(["hooks", "check", "--sglang-root", str(root)]) == 0
    assert "layout: shared-step" in capsys.readouterr().out and "#31499" in "\n".join(rep.lines())
    # a refactor whose verify does not take (batch, ctx): named, exit 1
    p = root / "sglang/srt/speculative/eagle_worker_common.py"
    p.write_text(p.read_text().replace("def run_eagle_verify(batch, ctx,", "def run_eagle_verify(batch, context,"))
    assert main(["hooks", "check", "--sglang-root", str(root)]) == 1
    fails = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("FAIL")]
    assert len(fails) == 1 and "run_eagle_verify" in fails[0] and "[changed signature]" in fails[0]


def test_fake_tree_passes(capsys):
    assert main(["hooks", "check", "--sglang-root", str(FAKE)]) == 0
    out = capsys.readouterr().out
    assert "21/21 ok" in out and "SGLang 0.5.5" in out and "layout: worker-step" in out
    assert "_resolve_spec_overlap_token_ids:" in out and "mark accept reads num_accepted_tokens" in out
    assert "accept_histogram from accept_length_per_req_cpu" in out  # the fake mixin stores it as 0.5.10 does
    assert out.count("host range scheduler.") == 5


def _broken(tmp_path: Path, file: str, old: str, new: str) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(FAKE, root)
    p = root / "sglang/srt/speculative" / file
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))
    return root


@pytest.mark.parametrize(
    "file,old,new,status,name",
    [
        ("eagle_worker.py", "def verify(self, batch, spec_info)", "def verify(self, b, spec_info)",
         "changed signature", "EAGLEWorker.verify"),
        ("eagle_worker_v2.py", "def _draft_extend_for_decode(", "def _draft_extend_for_decode_v3(",
         "missing method", "EagleDraftWorker._draft_extend_for_decode"),
        ("eagle_worker_v2.py", "self.cuda_graph_runner.replay(model_worker_batch)", "pass",
         "changed body", "EagleDraftWorker.draft"),
        ("eagle_worker_v2.py", "class EAGLEWorkerV2:", "class EAGLEWorkerV3:", "missing class",
         "EAGLEWorkerV2.forward_batch_generation"),
        ("standalone_worker_v2.py", "class StandaloneWorkerV2(EAGLEWorkerV2):\n    pass",
         "class StandaloneWorkerV2(EAGLEWorkerV2):\n    def verify(self, batch):\n        pass",
         "overrides patched method", "StandaloneWorkerV2"),
    ],
)
def test_broken_tree_names_the_target_and_exits_1(tmp_path, capsys, file, old, new, status, name):
    root = _broken(tmp_path, file, old, new)
    assert main(["hooks", "check", "--sglang-root", str(root)]) == 1
    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if line.strip().startswith("FAIL")]
    assert fails and all(f"[{status}]" in f for f in fails), out
    assert name in fails[0], out
    assert len(fails) == (2 if status == "missing class" else 1), out  # class gone: its 2 required methods


MIXIN_FILE = "sglang/srt/managers/scheduler_output_processor_mixin.py"


@pytest.mark.parametrize(
    "old,new,status,detail",
    [
        ("result.num_accepted_tokens = sum(accept_lens) - len(batch.reqs)",
         "result.num_correct_drafts = sum(accept_lens) - len(batch.reqs)",
         "changed body", "assigns none of result.num_accepted_tokens"),
        ("def _resolve_spec_overlap_token_ids(self, result, batch)",
         "def _resolve_spec_overlap_token_ids(self, res, batch)", "changed signature", "parameter 1 is 'res'"),
        ("def _resolve_spec_overlap_token_ids(", "def _resolve_spec_overlap_tokens(", "missing method",
         "none of _resolve_spec_overlap_token_ids"),
    ],
)
def test_broken_accept_site_names_it_and_exits_1(tmp_path, capsys, old, new, status, detail):
    root = tmp_path / "tree"
    shutil.copytree(FAKE, root)
    p = root / MIXIN_FILE
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))
    assert main(["hooks", "check", "--sglang-root", str(root)]) == 1
    fails = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("FAIL")]
    assert len(fails) == 1, fails
    assert "SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids" in fails[0]
    assert f"[{status}]" in fails[0] and detail in fails[0], fails[0]


def test_a_stale_cache_is_fetched_again(tmp_path, monkeypatch):
    """A tree unpacked by an older spectrace (no file-set stamp) is replaced, not reused."""
    old = tmp_path / "sglang" / "0.5.23"
    (old / "sglang").mkdir(parents=True)
    (old / "SGLANG_VERSION").write_text("0.5.23\n")

    def fake_pip(cmd, **kw):  # stands for ``pip download``: writes a wheel with the files the check reads
        with zipfile.ZipFile(Path(cmd[cmd.index("-d") + 1]) / "sglang-0.5.23-py3-none-any.whl", "w") as z:
            z.writestr("sglang/version.py", '__version__ = "0.5.23"\n')
            z.writestr("sglang/srt/managers/scheduler_components/batch_result_processor.py", "X = 1\n")
            z.writestr("sglang/srt/managers/io_struct.py", "not wanted\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(check.subprocess, "run", fake_pip)
    got = fetch_sglang("0.5.23", cache=tmp_path / "sglang")
    assert got == old and (got / "sglang/srt/managers/scheduler_components/batch_result_processor.py").is_file()
    assert not (got / "sglang/srt/managers/io_struct.py").exists()
    assert [p.name for p in (tmp_path / "sglang").iterdir()] == ["0.5.23"]  # no leftovers
    monkeypatch.setattr(check.subprocess, "run", lambda *a, **k: pytest.fail("fresh cache fetched again"))
    assert fetch_sglang("0.5.23", cache=tmp_path / "sglang") == old


def test_missing_module(tmp_path, capsys):
    root = tmp_path / "tree"
    shutil.copytree(FAKE, root)
    (root / "sglang/srt/speculative/eagle_worker.py").unlink()
    assert main(["hooks", "check", "--sglang-root", str(root)]) == 1
    assert capsys.readouterr().out.count("[missing module]") == 6


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["hooks", "check", "--sglang-root", str(tmp_path / "nope")]) == 2
    assert main(["hooks", "check", "--sglang-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("spectrace: error:") == 2


def test_check_never_imports_sglang_or_torch(tmp_path):
    before = set(sys.modules)
    check_tree(FAKE)
    assert not any(m.split(".")[0] in ("sglang", "torch") for m in set(sys.modules) - before)


def test_version_parsing_and_table_span():
    assert parse_version("0.5.10.post2") == (0, 5, 10)
    assert parse_version("0.5.0rc0") == (0, 5, 0)
    assert parse_version("garbage") is None
    assert not supported(parse_version("0.0.0.dev0")) and not supported((0, 4, 5))
    assert not supported((0, 5, 24)) and supported((0, 5, 23))
    assert all(t.phase for t in targets_for((0, 5, 10)))
    assert not any(t.module.endswith(".eagle_worker") for t in targets_for((0, 5, 13)))


def test_broken_scheduler_method_is_named(tmp_path, capsys):
    """A run_batch that no longer calls the worker (the cycle would not nest in scheduler.run_batch): named."""
    root = tmp_path / "tree"
    shutil.copytree(FAKE, root)
    p = root / "sglang/srt/managers/scheduler.py"
    text = p.read_text()
    assert text.count("self.model_worker.forward_batch_generation(batch)") == 2
    p.write_text(text.replace("self.model_worker.forward_batch_generation(batch)", "self.model_worker.run(batch)"))
    assert main(["hooks", "check", "--sglang-root", str(root)]) == 1
    fails = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("FAIL")]
    assert len(fails) == 1 and "Scheduler.run_batch" in fails[0] and "[changed body]" in fails[0], fails
