"""Fake ``sglang.srt.managers.scheduler_components.request_receiver`` (0.5.13 … 0.5.23 shape)."""


class SchedulerRequestReceiver:
    def recv_requests(self):
        # 0.5.23 :80 (zmq polls, broadcast); nothing arrives here
        from sglang.srt.managers.scheduler import CALLS

        CALLS.append(("recv_requests", None))
        return []
