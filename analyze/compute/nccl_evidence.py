"""The NCCL protocol and algorithm a run was set to, from evidence only (the capture's recorded environment), and
COMM_SHARE's advice from it (:mod:`analyze.compute.findings`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Result

__all__ = ["PROTOS", "NcclSetting", "nccl_setting", "comm_action"]


# NCCL's kernel names carry an algorithm and a protocol (ncclDevKernel_AllReduce_Sum_bf16_RING_LL), but not the
# ones a collective ran with: NCCL names the kernel ..._RING_LL under NCCL_PROTO=Simple too (the bundled
# tp2_nccl_simple capture). The name is never evidence of the protocol; only the recorded environment is.
PROTOS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}


@dataclass(frozen=True)
class NcclSetting:
    """The NCCL protocol (and algorithm) a run's collectives were set to, and where that is known from
    (``proto`` None: the recorded environment shows NCCL_PROTO unset, so NCCL chose per message size)."""

    proto: str | None  # LL, LL128, Simple; None: unset (NCCL's own choice per size)
    algo: str | None  # Ring, Tree, NVLS, ... as set (NCCL_ALGO)
    source: str


def nccl_setting(res: Result, phase: str | None = None) -> NcclSetting | None:
    """The NCCL protocol and algorithm the run was set to, from evidence only: the capture's recorded environment
    (``nccl_env`` of the manifest ``spectrace trace`` writes beside the capture: ``NCCL_PROTO``/``NCCL_ALGO``, set
    or unset). None when nothing recorded it: the kernel's name is no evidence (NCCL names its kernel ``…RING_LL``
    under both LL and Simple), and NCCL's NVTX payload carries message sizes and ranks, not the protocol.
    ``phase``: unused (one setting per process; kept for callers of the per-phase form)."""
    from ..read.manifest import read_manifest

    m = read_manifest(res.trace.path) or {}
    if "nccl_env" not in m:
        return None
    env = m.get("nccl_env") or {}
    raw = str(env.get("NCCL_PROTO", "")).strip()
    proto = PROTOS.get(raw.lower())
    algo = str(env.get("NCCL_ALGO", "")).strip() or None
    if proto is None and raw:  # a list or an exclusion (^LL): said as recorded, no advice from it
        return NcclSetting(None, algo, f"NCCL_PROTO={raw} in the capture's recorded environment")
    if proto is not None:
        return NcclSetting(proto, algo, "NCCL_PROTO in the capture's recorded environment")
    return NcclSetting(None, algo, "NCCL_PROTO unset in the capture's recorded environment: NCCL chose the "
                                   "protocol per message size")


_UNKNOWN_PROTO = ("The NCCL protocol this run used is unknown (no recorded environment: the kernel's name does not "
                  "say it; `spectrace trace` records NCCL_* variables in the manifest). Whichever it was, try each of "
                  "NCCL_PROTO=LL, LL128 and Simple and NCCL_ALGO (Ring, Tree, NVLS) and measure each with "
                  "`spectrace compare`; ")


def comm_action(s: NcclSetting | None) -> str:
    """COMM_SHARE's advice from the setting the run is known to have had; when nothing recorded it, advice that
    holds whatever the protocol was."""
    rest = ("SGLang's custom all-reduce (do not pass --disable-custom-all-reduce; needs NVLink/P2P), NVLS or "
            "symmetric-memory all-reduce on NVSwitch, or a smaller TP size for this model; measure with "
            "`spectrace compare`.")
    if s is None:
        return _UNKNOWN_PROTO + "or " + rest
    algo = f", NCCL_ALGO={s.algo}" if s.algo else ""
    if s.proto is None:
        return (f"This run left the protocol to NCCL ({s.source}{algo}): pin NCCL_PROTO=LL, then LL128, and try "
                f"NCCL_ALGO, measuring each with `spectrace compare`; or {rest}")
    now = f"This run was set to NCCL's {s.proto} protocol{algo} ({s.source})."
    if s.proto == "LL":
        return f"{now} LL is already the lowest-latency protocol: next try NCCL_ALGO (e.g. Tree, or NVLS), {rest}"
    if s.proto == "LL128":
        return f"{now} LL has the lower latency for small messages: try NCCL_PROTO=LL, then NCCL_ALGO, {rest}"
    return (f"{now} Simple is built for large messages; for small ones try NCCL_PROTO=LL (or LL128) and NCCL_ALGO, "
            f"{rest}")
