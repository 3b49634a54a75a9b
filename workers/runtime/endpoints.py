"""A pod's HTTP endpoints (the operator's probes and Prometheus read them): /healthz (the process
is alive), /readyz (ready to take work: joined the cluster, or, on the controller, running
steps), /metrics (this process's registry and the `.prom` files its role workers wrote)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class Endpoints:
    def __init__(self, port: int, registry: CollectorRegistry, metrics_dir: Path | None = None,
                 host: str = "0.0.0.0") -> None:
        self.registry = registry
        self.metrics_dir = metrics_dir
        self.ready = threading.Event()
        self.alive = threading.Event()
        self.alive.set()
        endpoints = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self._reply(200 if endpoints.alive.is_set() else 503, b"ok\n", "text/plain")
                elif self.path == "/readyz":
                    self._reply(200 if endpoints.ready.is_set() else 503, b"ready\n" if endpoints.ready.is_set()
                                else b"not ready\n", "text/plain")
                elif self.path == "/metrics":
                    self._reply(200, endpoints.metrics(), CONTENT_TYPE_LATEST)
                else:
                    self._reply(404, b"not found\n", "text/plain")

            def _reply(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: no log
                return

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="endpoints", daemon=True)
        self.thread.start()

    def metrics(self) -> bytes:
        body = generate_latest(self.registry)
        if self.metrics_dir is not None and self.metrics_dir.is_dir():
            for f in sorted(self.metrics_dir.glob("*.prom")):
                body += f.read_bytes()
        return body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
