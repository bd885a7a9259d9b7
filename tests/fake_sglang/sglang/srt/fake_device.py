"""Stands for torch: device tensors and CUDA events that count every host access.

Nothing here exists in SGLang. A ``Tensor`` is a list of ints on a fake device; the calls that would make
the host wait for the GPU or copy from it (``Event.synchronize``, ``.to("cpu")``, ``.cpu()``, ``.item()``,
``.tolist()``, and reading a device tensor's values by iteration, ``int``/``bool``, ``sum``) add one to
``COUNTS[name]``. Tests compare the counts with and without the hooks: the hooks must add none.
"""

from collections import Counter

COUNTS: Counter = Counter()


class Tensor:
    """A 1-D int tensor on ``device`` ("cuda" or "cpu")."""

    def __init__(self, values, device="cuda"):
        self._v = [int(x) for x in values]
        self.device = device

    @property
    def is_cpu(self):
        return self.device == "cpu"

    @property
    def is_cuda(self):
        return self.device == "cuda"

    @property
    def shape(self):  # metadata: no sync in torch
        return (len(self._v),)

    def to(self, device, non_blocking=False):
        COUNTS[f"to_{device}"] += 1
        return Tensor(self._v, device)

    def cpu(self):
        COUNTS["cpu"] += 1
        return Tensor(self._v, "cpu")

    def item(self):
        COUNTS["item"] += 1
        return self._v[0]

    def tolist(self):
        COUNTS["tolist"] += 1
        if not self.is_cpu:
            COUNTS["sync"] += 1  # torch waits for the GPU here
        return list(self._v)

    def __add__(self, other):  # a kernel: stays on the device
        o = other._v if isinstance(other, Tensor) else [other] * len(self._v)
        return Tensor([a + b for a, b in zip(self._v, o)], self.device)

    def _read(self):
        COUNTS["read"] += 1
        if not self.is_cpu:
            COUNTS["sync"] += 1
        return self._v

    def __iter__(self):
        return iter(self._read())

    def __int__(self):
        return int(self._read()[0])

    def __index__(self):
        return int(self._read()[0])

    def __bool__(self):
        return bool(self._read())

    def __len__(self):  # torch: the first dimension, metadata only
        return len(self._v)

    def __repr__(self):
        return f"Tensor({self._v}, device={self.device!r})"


class Event:
    """``torch.cuda.Event``: ``record`` is asynchronous, ``synchronize`` blocks the host."""

    def __init__(self):
        self.recorded = False

    def record(self, stream=None):
        COUNTS["record"] += 1
        self.recorded = True

    def synchronize(self):
        COUNTS["synchronize"] += 1
