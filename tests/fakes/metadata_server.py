"""A loopback cloud metadata service for runtime/programs/notice.py: AWS IMDSv2, GCP and Azure, each in its
own dialect, no notice until `announce()`.

Strict where the real ones are: AWS answers `spot/instance-action` only with a token from
`PUT /latest/api/token` (401 without, as IMDSv2 does) and 404 until a notice; GCP answers only
with `Metadata-Flavor: Google` (403 without); Azure only with `Metadata: true` (400 without).
Anything else is 404. `requests` counts what was asked, by path.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NOTICE_TIME = "2026-12-04T12:00:00Z"


class MetadataServer:
    def __init__(self) -> None:
        self.noticed = threading.Event()
        self.tokens: set[str] = set()
        self.requests: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:  # noqa: N802
                server.requests[self.path] += 1
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    token = secrets.token_hex(8)
                    server.tokens.add(token)
                    return self._reply(200, token.encode())
                return self._reply(400 if self.path == "/latest/api/token" else 404, b"")

            def do_GET(self) -> None:  # noqa: N802
                server.requests[self.path] += 1
                status, body = server.answer(self.path, self.headers)
                self._reply(status, body)

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def answer(self, path: str, headers: Any) -> tuple[int, bytes]:
        if path == "/latest/meta-data/spot/instance-action":
            if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
                return 401, b""
            if not self.noticed.is_set():
                return 404, b""
            return 200, json.dumps({"action": "terminate", "time": NOTICE_TIME}).encode()
        if path == "/computeMetadata/v1/instance/preempted":
            if headers.get("Metadata-Flavor") != "Google":
                return 403, b""
            return 200, b"TRUE" if self.noticed.is_set() else b"FALSE"
        if path == "/metadata/scheduledevents?api-version=2020-07-01":
            if headers.get("Metadata") != "true":
                return 400, b""
            events = (
                [
                    {
                        "EventId": "e1",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "NotBefore": "Fri, 04 Dec 2026 12:00:30 GMT",
                    }
                ]
                if self.noticed.is_set()
                else []
            )
            return 200, json.dumps({"DocumentIncarnation": 1, "Events": events}).encode()
        return 404, b""

    def announce(self) -> None:
        """The provider reclaims the instance: every dialect reports the notice from now on."""
        self.noticed.set()

    def __enter__(self) -> "MetadataServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
