"""Fake v2 ``EAGLEWorkerV2`` / ``EagleDraftWorker`` (0.5.5 signatures).

The decode path follows the real 0.5.10 ``eagle_worker_v2.py`` (``forward_batch_generation`` :690-739,
``verify`` :741-870; 0.5.23 :1416-1512 is the same for these lines): verify leaves the accept lengths on the
device inside the ``GenerationBatchResult`` it returns, and the draft extend reads them there.
"""

from sglang.srt.fake_device import Tensor
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.common import DraftRunner, GraphRunner

LOG = []


class EagleDraftWorker:
    def __init__(self, speculative_num_steps=3):
        self.speculative_num_steps = speculative_num_steps  # 0.5.23 :198
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
        # 0.5.10 :579 ``forward_batch.spec_info.accept_length = batch_result.accept_lens``: stays on the device
        self.accept_length_seen = batch_result.accept_lens
        self.cuda_graph_runner_for_draft_extend.replay(batch)


class EAGLEWorkerV2:
    """``accept``: per decode cycle, the accepted draft tokens of each request (cycled through)."""

    def __init__(self, accept=None, speculative_num_draft_tokens=4):
        self.target_worker = TpModelWorker()
        self.speculative_num_steps = speculative_num_draft_tokens - 1  # topk 1: steps + 1 draft tokens
        self.draft_worker = EagleDraftWorker(self.speculative_num_steps)
        self.speculative_num_draft_tokens = speculative_num_draft_tokens
        self.accept, self.n_verify = list(accept or []), 0

    def forward_batch_generation(self, model_worker_batch):
        if model_worker_batch.forward_mode.is_decode():
            model_worker_batch.spec_info = self.draft_worker.draft(model_worker_batch)  # :724-729
            batch_output = self.verify(model_worker_batch, None)  # :732
            self.draft_worker._draft_extend_for_decode(model_worker_batch, batch_output)  # :736-738
            return batch_output  # :739
        out = self.target_worker.forward_batch_generation(model_worker_batch)  # :697-699
        self.draft_worker._draft_extend_for_prefill(model_worker_batch, "hidden", out[1])  # :706-713
        # :714 returns the target's GenerationBatchResult (one next token per request, on the device)
        return GenerationBatchResult(next_token_ids=Tensor(out[1] * len(model_worker_batch.reqs)))

    def verify(self, batch, cur_allocate_lens):
        self.target_worker.forward_batch_generation(batch, is_verify=True)  # :792
        bs, stride = len(batch.reqs), self.speculative_num_draft_tokens
        drafts = self.accept[self.n_verify % len(self.accept)] if self.accept else [1] * bs
        self.n_verify += 1
        # :822-826 ``predict, accept_length, accept_index = verify_input.sample(...)``: device tensors;
        # accept_length counts the bonus token (accepted drafts + 1)
        accept_length = Tensor([d + 1 for d in drafts])
        predict = Tensor(range(bs * stride))
        return GenerationBatchResult(  # :863-869
            next_token_ids=predict,
            accept_lens=accept_length,
            speculative_num_draft_tokens=stride,  # 0.5.12+ records the stride on the result
        )

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
        """0.5.23 ``base_spec_worker.py:379``: no-op unless the worker adapts its draft length."""
