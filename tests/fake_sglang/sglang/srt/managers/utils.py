"""Fake ``sglang.srt.managers.utils``: ``GenerationBatchResult``, the object a worker returns and the scheduler
queues and processes (real: 0.5.10 ``managers/utils.py:24-93``, 0.5.23 ``managers/utils.py:55-215``).

The fake holds the fields of both shapes: ``num_accepted_tokens`` (0.5.4 … 0.5.10) and ``num_correct_drafts``
(0.5.12 … 0.5.23), so a hook that read the wrong one for its version would read the other's default.
"""

import dataclasses

from sglang.srt.fake_device import Event, Tensor


@dataclasses.dataclass
class GenerationBatchResult:
    logits_output: object | None = None
    next_token_ids: Tensor | None = None
    num_accepted_tokens: int = 0  # 0.5.10 utils.py:29
    accept_length_per_req_cpu: list | None = None  # 0.5.10 utils.py:30
    num_correct_drafts: int = 0  # 0.5.23 utils.py:62 "no bonus included"
    num_correct_drafts_per_req_cpu: list | None = None
    num_non_draft_tokens_per_req: int = 1  # 0.5.23 utils.py:90 (EAGLE: the bonus token)
    can_run_cuda_graph: bool = False

    # For overlap scheduling
    copy_done: Event | None = None
    delay_sample_func: object | None = None

    # sync path: forward stream -> output processor
    accept_lens: Tensor | None = None
    speculative_num_draft_tokens: int | None = None  # 0.5.12+: the stride used by result processing

    # relay path: forward stream -> next step forward
    next_draft_input: object | None = None

    def copy_to_cpu(self, return_logprob: bool = False):
        """0.5.10 utils.py:52-93 (0.5.23 utils.py:168-215 is the same with ``_async_d2h``): non-blocking
        D2H copies on the current stream, then ``copy_done.record()``; nothing waits here."""
        self.next_token_ids = self.next_token_ids.to("cpu", non_blocking=True)  # utils.py:85

        if self.accept_lens is not None:  # utils.py:87-88
            self.accept_lens = self.accept_lens.to("cpu", non_blocking=True)

        self.copy_done.record()  # utils.py:93
