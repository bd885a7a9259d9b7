"""Fake batches and graph runners shared by the fake workers (host objects only, no torch)."""


class ForwardMode:
    def __init__(self, kind):
        self.kind = kind

    def is_extend(self):
        return self.kind == "extend"

    def is_decode(self):
        return self.kind == "decode"

    def is_idle(self):
        return self.kind == "idle"


class SpeculativeAlgorithm:
    def __init__(self, name="EAGLE3"):
        self.name = name

    def is_none(self):
        return self.name == "NONE"


class Batch:
    """Stands for ScheduleBatch: ``reqs``, ``forward_mode`` and what result processing reads."""

    def __init__(self, n, kind="decode", reqs=None):
        self.reqs = list(range(n)) if reqs is None else reqs
        self.forward_mode = ForwardMode(kind)
        self.is_extend_in_batch = False
        self.spec_algorithm = SpeculativeAlgorithm()
        self.is_spec_v2 = True
        self.return_logprob = False

    def batch_size(self):  # schedule_batch.py:1476-1477 (0.5.10)
        return len(self.reqs)

    def copy(self):
        """schedule_batch.py:2395-2420 (0.5.10): the fields process_batch_result uses; reqs list copied."""
        b = Batch(0, self.forward_mode.kind, reqs=self.reqs[:])
        b.is_extend_in_batch, b.spec_algorithm, b.is_spec_v2 = self.is_extend_in_batch, self.spec_algorithm, self.is_spec_v2
        return b


class VerifyOutput:
    def __init__(self, accept):
        self.accept_length_per_req_cpu = accept


class GraphRunner:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def replay(self, forward_batch):
        self.log.append((self.name, "replay"))


class DraftRunner:
    def __init__(self, log):
        self.log = log

    def forward(self, forward_batch):
        self.log.append(("draft_model", "forward"))
