"""spectrace analysis: per-rank, per-phase GPU compute, communication and idle time from nsys exports."""

__version__ = "0.1.0"
