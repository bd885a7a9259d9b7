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


class Batch:
    """Stands for ScheduleBatch: ``reqs`` and ``forward_mode``."""

    def __init__(self, n, kind="decode"):
        self.reqs = list(range(n))
        self.forward_mode = ForwardMode(kind)
        self.is_extend_in_batch = False


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
