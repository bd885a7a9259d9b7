"""Fake v2 ``EAGLEWorkerV2`` / ``EagleDraftWorker`` (0.5.5 shape)."""

from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.speculative.common import DraftRunner, GraphRunner

LOG = []


class EagleDraftWorker:
    def __init__(self):
        self.cuda_graph_runner = GraphRunner(LOG, "draft_graph")
        self.draft_model_runner = DraftRunner(LOG)
        self.cuda_graph_runner_for_draft_extend = GraphRunner(LOG, "extend_graph")

    def draft(self, model_worker_batch):
        self.cuda_graph_runner.replay(model_worker_batch)
        return "verify_input"

    def _draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids):
        self.draft_model_runner.forward(batch)
        return "next_draft_input"

    def _draft_extend_for_decode(self, batch, batch_result):
        self.cuda_graph_runner_for_draft_extend.replay(batch)


class EAGLEWorkerV2:
    def __init__(self):
        self.target_worker = TpModelWorker()
        self.draft_worker = EagleDraftWorker()

    def forward_batch_generation(self, model_worker_batch):
        if model_worker_batch.forward_mode.is_decode():
            model_worker_batch.spec_info = self.draft_worker.draft(model_worker_batch)
            out = self.verify(model_worker_batch, None)
            self.draft_worker._draft_extend_for_decode(model_worker_batch, out)
            return out
        out = self.target_worker.forward_batch_generation(model_worker_batch)
        self.draft_worker._draft_extend_for_prefill(model_worker_batch, "hidden", out[1])
        return out

    def verify(self, batch, cur_allocate_lens):
        return self.target_worker.forward_batch_generation(batch, is_verify=True)
