"""Fake ``sglang.srt.managers.scheduler_output_processor_mixin``, 0.5.10 shape (0.5.4 … 0.5.12 keep the class;
0.5.11 renames the count ``num_accepted_drafts``, 0.5.12 the method ``_resolve_spec_overlap_tokens``).

Line numbers are of the real 0.5.10 ``scheduler_output_processor_mixin.py``. Only the lines that touch the
result's tensors and the accept count are kept; per-request bookkeeping, logprobs, streaming are left out.
"""


class SchedulerOutputProcessorMixin:
    def process_batch_result_prefill(self, batch, result):
        # :123-147
        if result.copy_done is not None:
            result.copy_done.synchronize()  # :132
        next_token_ids = result.next_token_ids.tolist()  # :147
        self.prefill_outputs.append(next_token_ids)

    def _resolve_spec_overlap_token_ids(self, result, batch):
        """Resolve the padding next token ids for speculative decoding with overlap."""
        # :334-360
        assert result.next_token_ids.is_cpu  # :338
        assert result.accept_lens.is_cpu  # :339

        next_token_ids = result.next_token_ids.tolist()  # :341
        accept_lens = result.accept_lens.tolist()  # :342: the accept lengths reach the host
        result.num_accepted_tokens = sum(accept_lens) - len(batch.reqs)  # :343
        result.accept_length_per_req_cpu = [x - 1 for x in accept_lens]  # :344

        predict_tokens = []
        stride = self.draft_worker.speculative_num_draft_tokens  # :347

        for i, _req in enumerate(batch.reqs):  # :349-358
            predict_tokens.append(next_token_ids[i * stride : i * stride + accept_lens[i]])

        return predict_tokens

    def process_batch_result_decode(self, batch, result):
        # :374-426
        if result.copy_done is not None:
            result.copy_done.synchronize()  # :380: waits for the copy queued by copy_to_cpu

        next_token_ids = result.next_token_ids

        if batch.spec_algorithm.is_none() or batch.is_spec_v2:  # :388
            if batch.is_spec_v2:
                next_token_ids = self._resolve_spec_overlap_token_ids(result, batch)  # :390
            else:
                next_token_ids = next_token_ids.tolist()  # :392

        self.num_generated_tokens += len(batch.reqs)  # :424
        if not batch.spec_algorithm.is_none():
            self.update_spec_metrics(batch.batch_size(), result.num_accepted_tokens)  # :426
        self.decode_outputs.append(next_token_ids)
