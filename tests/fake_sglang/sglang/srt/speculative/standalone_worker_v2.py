"""Fake standalone v2 workers: subclasses that override nothing."""

from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2


class StandaloneDraftWorker(EagleDraftWorker):
    pass


class StandaloneWorkerV2(EAGLEWorkerV2):
    pass
