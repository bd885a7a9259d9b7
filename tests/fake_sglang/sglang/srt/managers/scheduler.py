"""Fake ``sglang.srt.managers.scheduler``: the loops that run a batch and process its result.

``Scheduler(worker)`` is the 0.5.10 shape (results processed by ``SchedulerOutputProcessorMixin``, requests
received by ``Scheduler.recv_requests``); ``Scheduler(worker, components=True)`` the 0.5.23 shape (by
``SchedulerBatchResultProcessor``, received by ``SchedulerRequestReceiver.recv_requests``,
``get_next_batch_to_run`` returning a plan). Line numbers are of the real ``scheduler.py`` of each version. The
loops take the batches to run as a list (``None``: no batch this iteration), which ``get_next_batch_to_run``
hands out one per iteration instead of scheduling received requests; everything else that does not touch the
result is left out.
"""

from collections import deque
from dataclasses import dataclass

from sglang.srt.fake_device import Event
from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
from sglang.srt.managers.scheduler_components.request_receiver import SchedulerRequestReceiver
from sglang.srt.managers.scheduler_output_processor_mixin import SchedulerOutputProcessorMixin

CALLS = []  # (method, argument) of the loop methods, in order


@dataclass
class ScheduleBatchPlan:
    """0.5.18+ ``get_next_batch_to_run`` result (0.5.23 :3894-3910)."""

    running_batch: object
    batch_to_run: object


class Scheduler(SchedulerOutputProcessorMixin):
    def __init__(self, worker, components=False, enable_overlap=True):
        self.tp_worker = worker.target_worker
        self.draft_worker = worker
        self.model_worker = self.draft_worker  # 0.5.10 :637-639, 0.5.23 :1206-1208 (speculative)
        self.enable_overlap = enable_overlap
        self.last_batch = None
        self.num_generated_tokens = 0
        self.spec_metrics = []  # (batch size, accepted drafts) per update_spec_metrics call
        self.decode_outputs, self.prefill_outputs = [], []
        # 0.5.23 :2662-2664 init_batch_result_processor
        self.batch_result_processor = SchedulerBatchResultProcessor(self) if components else None
        self.request_receiver = SchedulerRequestReceiver() if components else None  # 0.5.13+
        self.components = components
        self.waiting = deque()

    def recv_requests(self):
        # 0.4.6 … 0.5.12 (0.5.10 :1423): zmq polls; nothing arrives here
        CALLS.append(("recv_requests", None))
        return []

    def ingest_requests(self):
        # 0.5.23 :2184-2221 (0.5.13+: the receiver component polls)
        recv_reqs = self.request_receiver.recv_requests() if self.components else self.recv_requests()
        self.process_input_requests(recv_reqs)
        return recv_reqs

    def process_input_requests(self, recv_reqs):
        CALLS.append(("process_input_requests", len(recv_reqs)))

    def get_next_batch_to_run(self):
        # hands out the next batch of the loop's list (0.5.18+: inside a plan)
        batch = self.waiting.popleft() if self.waiting else None
        CALLS.append(("get_next_batch_to_run", batch))
        return ScheduleBatchPlan(None, batch) if self.components else batch

    def _next(self):
        out = self.get_next_batch_to_run()
        return out.batch_to_run if self.components else out

    def update_spec_metrics(self, bs, num_accepted_tokens):
        self.spec_metrics.append((bs, num_accepted_tokens))

    def event_loop_normal(self, batches):
        # 0.5.10 :1303-1325, 0.5.23 :2026-2058
        self.waiting = deque(batches)
        while self.waiting:
            self.ingest_requests()
            batch = self._next()
            if batch:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
            self.last_batch = batch

    def event_loop_overlap(self, batches):
        """A scheduler loop that overlaps the CPU processing and GPU computation."""
        # 0.5.10 :1331-1380, 0.5.23 :2061-2129
        self.result_queue = deque()

        def pop_and_process():
            # Process the results of the last batch
            tmp_batch, tmp_result = self.result_queue.popleft()
            self.process_batch_result(tmp_batch, tmp_result)

        self.waiting = deque(batches)
        while self.waiting:
            self.ingest_requests()
            batch = self._next()
            # Launch the current batch
            if batch:
                batch_result = self.run_batch(batch)
                self.result_queue.append((batch.copy(), batch_result))

            # Process the last batch
            if self.last_batch:
                pop_and_process()

            # Update last_batch
            self.last_batch = batch

    def run_batch(self, batch):
        if self.enable_overlap:
            # 0.5.10 :2684-2692, 0.5.23 :4704-4745: forward on forward_stream, then queue the D2H copy
            batch_result = self.model_worker.forward_batch_generation(batch)
            batch_result.copy_done = Event()
            if batch_result.delay_sample_func is None:
                batch_result.copy_to_cpu(return_logprob=batch.return_logprob)
        else:
            # 0.5.23 :4826-4865: spec v2 without overlap drives the worker synchronously, same copy
            batch_result = self.model_worker.forward_batch_generation(batch)
            batch_result.copy_done = Event()
            batch_result.copy_to_cpu(return_logprob=batch.return_logprob)
        return batch_result

    def process_batch_result(self, batch, result):
        # 0.5.10 :2811-2828 (mixin methods), 0.5.23 :5074-5103 (the component's)
        proc = self.batch_result_processor or self
        if batch.forward_mode.is_decode():
            proc.process_batch_result_decode(batch, result)
        elif batch.forward_mode.is_extend():
            proc.process_batch_result_prefill(batch, result)
