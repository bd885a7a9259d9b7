"""Fake v1 ``EAGLEWorker`` (0.5.3 … 0.5.12 shape)."""

from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.speculative.common import DraftRunner, GraphRunner, VerifyOutput

LOG = []


class EAGLEWorker(TpModelWorker):
    def __init__(self, accept=(1, 2), fail_in=None, speculative_num_steps=3):
        self.speculative_num_steps = speculative_num_steps  # 0.5.5 :101 (v1 adaptive 0.5.11+ rewrites it)
        self.target_worker = TpModelWorker()
        self.cuda_graph_runner = GraphRunner(LOG, "draft_graph")
        self.draft_model_runner = DraftRunner(LOG)
        self.cuda_graph_runner_for_draft_extend = GraphRunner(LOG, "extend_graph")
        self.accept, self.fail_in = list(accept), fail_in

    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            logits, next_ids, bid = self.forward_target_extend(batch)
            self.forward_draft_extend(batch, "hidden", next_ids, None)
            return logits, next_ids, bid, 0
        spec_info = self.draft(batch)
        logits, verify_output, mwb, can_run = self.verify(batch, spec_info)
        self.forward_draft_extend_after_decode(batch)
        return logits, verify_output, mwb, sum(verify_output.accept_length_per_req_cpu)

    def forward_target_extend(self, batch):
        return self.target_worker.forward_batch_generation(batch)

    def draft(self, batch):
        if self.fail_in == "draft":
            raise RuntimeError("draft failed")
        self.cuda_graph_runner.replay(batch)
        return "spec_info"

    def verify(self, batch, spec_info):
        self.target_worker.forward_batch_generation(batch, is_verify=True)
        if self.fail_in == "verify":
            raise RuntimeError("verify failed")
        return "logits", VerifyOutput(self.accept), batch, True

    def forward_draft_extend(self, batch, hidden_states, next_token_ids, seq_lens_cpu):
        self.draft_model_runner.forward(batch)

    def forward_draft_extend_after_decode(self, batch):
        self.cuda_graph_runner_for_draft_extend.replay(batch)
