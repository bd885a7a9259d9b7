"""Fake ``sglang.srt.managers.tp_worker``."""

CALLS = []


class TpModelWorker:
    """The target worker: one forward per call."""

    def forward_batch_generation(self, model_worker_batch, is_verify=False):
        CALLS.append(("target_forward", is_verify))
        return "logits", [1], 0
