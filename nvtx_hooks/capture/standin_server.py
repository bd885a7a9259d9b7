"""A tiny stand-in for ``sglang.launch_server``: the same HTTP endpoints, no GPU, no model.

``/health``, ``/generate``, ``/start_profile``, ``/stop_profile``. Each /generate emits one
``cycle`` range per "decode step" through :mod:`nvtx_hooks.ranges` (so a capture has NVTX
to find). Accepts and ignores SGLang's launch flags; ``--log FILE`` records one JSON line per
event (for tests). Stops cleanly on SIGINT/SIGTERM. Try ``make trace`` with it::

    make trace SERVER="python -m nvtx_hooks.capture.standin_server" MODEL=x DRAFT=y TP=1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns 0 after a clean stop."""
    p = argparse.ArgumentParser(prog="python -m nvtx_hooks.capture.standin_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--log", default=None)
    p.add_argument("--startup-s", type=float, default=0.2, help="seconds before /health answers 200")
    p.add_argument("--step-ms", type=float, default=1.0, help="time per fake decode step")
    a, unknown = p.parse_known_args(argv)
    from nvtx_hooks import ranges
    from nvtx_hooks.phases import encode_payload

    lock = threading.Lock()
    t_ready = time.monotonic() + a.startup_s
    cycle = [0]

    def record(event: str, **kw):
        if a.log:
            with lock, open(a.log, "a") as f:
                f.write(json.dumps({"event": event, "pid": os.getpid(), **kw}) + "\n")

    record("start", argv=list(argv if argv is not None else sys.argv[1:]), unknown=unknown,
           hooks=os.environ.get("SPECTRACE_HOOKS"))

    class H(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: dict):
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path.startswith("/health"):
                ok = time.monotonic() >= t_ready
                self._send(200 if ok else 503, {"ok": ok})
            else:
                self._send(404, {"error": self.path})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            if self.path == "/generate":
                steps = int(body.get("sampling_params", {}).get("max_new_tokens", 8))
                for _ in range(steps):
                    with lock:
                        i = cycle[0]
                        cycle[0] += 1
                    with ranges.phase_range("cycle", encode_payload(1, i)):
                        time.sleep(a.step_ms / 1000)
                record("generate", tokens=steps)
                self._send(200, {"text": "x" * steps, "meta_info": {"completion_tokens": steps}})
            elif self.path in ("/start_profile", "/stop_profile"):
                record(self.path.strip("/"), body=body)
                self._send(200, {"ok": True})
            else:
                self._send(404, {"error": self.path})

    srv = ThreadingHTTPServer((a.host, a.port), H)
    srv.daemon_threads = True

    def stop(signum, frame):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    srv.serve_forever(poll_interval=0.05)
    srv.server_close()
    record("stop", cycles=cycle[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
