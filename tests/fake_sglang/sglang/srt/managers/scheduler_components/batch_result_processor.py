"""Fake ``sglang.srt.managers.scheduler_components.batch_result_processor``, 0.5.23 shape (0.5.13 … 0.5.23).

Line numbers are of the real 0.5.23 ``batch_result_processor.py``. Only the lines that touch the result's
tensors and the accept count are kept; grammar, per-request KV bookkeeping, logprobs are left out.
"""


def _get_speculative_output_stride(result):
    # :86-93
    stride = result.speculative_num_draft_tokens
    if stride is None or stride < 1:
        raise RuntimeError("speculative result is missing a positive output row stride")
    return stride


class SchedulerBatchResultProcessor:
    """A scheduler component (0.5.13+): the scheduler builds one and hands it its state."""

    def __init__(self, scheduler):
        self.model_worker = scheduler.model_worker
        self.metrics_reporter = scheduler

    def process_batch_result_prefill(self, batch, result):
        # :258-293
        if result.copy_done is not None:
            result.copy_done.synchronize()  # :268
        next_token_ids = result.next_token_ids.tolist()  # :293
        self.metrics_reporter.prefill_outputs.append(next_token_ids)

    def _resolve_spec_v2_tokens(self, result, batch):
        """Resolve the padded next token ids for spec-v2 (overlap and non-overlap)."""
        # :770-846
        assert result.next_token_ids.is_cpu  # :776
        assert result.accept_lens.is_cpu  # :777

        next_token_ids = result.next_token_ids.tolist()  # :781
        accept_lens = result.accept_lens.tolist()  # :782: the accept lengths reach the host
        stride = _get_speculative_output_stride(result)  # :783
        num_non_draft = result.num_non_draft_tokens_per_req  # :784
        result.num_correct_drafts_per_req_cpu = [length - num_non_draft for length in accept_lens]  # :785-787
        result.num_correct_drafts = sum(result.num_correct_drafts_per_req_cpu)  # :788

        self.model_worker.on_verify_complete_cpu(  # :804-806
            result.num_correct_drafts_per_req_cpu, batch_size=len(batch.reqs)
        )

        predict_tokens = []
        for i, _req in enumerate(batch.reqs):  # :816-844
            accept_tokens = next_token_ids[i * stride : i * stride + accept_lens[i]]
            predict_tokens.append(accept_tokens)

        return predict_tokens

    def process_batch_result_decode(self, batch, result):
        # :952-992
        if result.copy_done is not None:
            result.copy_done.synchronize()  # :958: waits for the copy queued by copy_to_cpu

        next_token_ids = self._normalize_decode_outputs(batch=batch, result=result)  # :975-980

        batch_size = batch.batch_size()  # :982
        num_generated_tokens = batch_size + result.num_correct_drafts  # :983 get_num_generated_tokens
        self.metrics_reporter.num_generated_tokens += num_generated_tokens  # :984
        if not batch.spec_algorithm.is_none():
            self.metrics_reporter.update_spec_metrics(batch_size, result.num_correct_drafts)  # :985-992
        self.metrics_reporter.decode_outputs.append(next_token_ids)

    def _normalize_decode_outputs(self, *, batch, result):
        # :1111-1146
        if not batch.spec_algorithm.is_none():  # :1122
            next_token_ids = self._resolve_spec_v2_tokens(result, batch)  # :1123
        else:
            next_token_ids = [[t] for t in result.next_token_ids.tolist()]  # :1124-1131
        return next_token_ids
