"""The wire layer of the loopback Hub in tests/fakes/hub_server.py: HTTP plumbing, replies, ranges, faults.

Why apart: hub_server.py and hub_repos.py hold what the Hub means (repos, commits, LFS); this holds how bytes go out,
what an honest server sends for a Range, and exactly what each fault changes in it, which is what the
store's verifier is tested against.

Body faults keep the status and headers an honest server would send, except `ignore_range`:
- flip_byte: the middle byte of the returned window is inverted (XOR 0xFF).
- shift_span: the window's bytes are taken `offset` bytes further into the file, wrapping at its end
  (so a whole-file GET is shifted too); status, Content-Range and Content-Length stay exact.
- truncate: only the first half of the window is sent; Content-Range still claims the whole window,
  Content-Length is the real (shorter) length, so the connection stays usable.
- ignore_range: 200 with the whole file and no Content-Range, as a server that ignores Range.
"""

from __future__ import annotations

import fnmatch
import json
import re
import socket
import threading
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

BODY_MODES = ("flip_byte", "shift_span", "ignore_range", "truncate")
REQUEST_MODES = ("status_429", "status_503", "hang")
RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass
class Fault:
    """A pending fault: `times` requests left to take it."""

    mode: str
    times: int
    path: str | None
    api: bool
    seconds: float
    offset: int

    def matches(self, file_path: str | None) -> bool:
        if file_path is None:
            return self.api
        return self.path is None or fnmatch.fnmatchcase(file_path, self.path)


@dataclass
class Reply:
    """A response; `content` (the whole file) and `window` are set when the body is file bytes."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    content: bytes | None = None
    window: tuple[int, int] | None = None


class HubError(Exception):
    """An error reply in the Hub's shape: JSON `{"error": ...}` plus X-Error-Message / X-Error-Code."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.fields = fields or {}

    def reply(self) -> Reply:
        headers = {"Content-Type": "application/json", "X-Error-Message": self.message, **self.headers}
        if self.code:
            headers["X-Error-Code"] = self.code
        return Reply(self.status, headers, json.dumps({"error": self.message, **self.fields}).encode())


def serve_bytes(data: bytes, range_header: str | None, headers: dict[str, str]) -> Reply:
    """200 with the whole file, or 206 with exactly the requested window (RFC 9110 single ranges)."""
    size = len(data)
    headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    match = RANGE_RE.match((range_header or "").strip())
    if not match or match.groups() == ("", ""):
        return Reply(200, headers, data, data)  # no Range, or one we must ignore
    first, last = match.groups()
    if first == "":
        start, end = max(0, size - int(last)), size - 1
        if int(last) == 0 or size == 0:
            raise HubError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
        if last and int(last) < start:
            return Reply(200, headers, data, data)  # invalid range: ignored
        if start >= size:
            raise HubError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return Reply(206, headers, data[start : end + 1], data, (start, end))


def corrupt(fault: Fault, reply: Reply) -> Reply:
    """Apply a body fault to a reply carrying file bytes; headers stay as an honest server sends them."""
    data, body = reply.content or b"", reply.body
    start = reply.window[0] if reply.window else 0
    if fault.mode == "flip_byte" and body:
        i = len(body) // 2
        body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :]
    elif fault.mode == "shift_span" and data:
        k = (start + fault.offset) % len(data)  # the span `offset` bytes later, wrapping at the end
        body = (data[k:] + data[:k])[: len(body)]
    elif fault.mode == "truncate":
        body = body[: len(body) // 2]
    elif fault.mode == "ignore_range":
        headers = {k: v for k, v in reply.headers.items() if k != "Content-Range"}
        return Reply(200, headers, data, data)
    return Reply(reply.status, reply.headers, body, data, reply.window)


class Hub(Protocol):
    """What an Origin serves: HubServer.handle."""

    def handle(self, origin: str, method: str, raw_path: str, headers: Message, body: bytes) -> Reply: ...


class _Handler(BaseHTTPRequestHandler):
    """Reads the whole request, asks the HubServer for a Reply, writes it (HTTP/1.1, keep-alive)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stalls
    server: Origin

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the HubServer keeps its own request log."""

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _dispatch(self) -> None:
        body = self._read_body()
        reply = self.server.hub.handle(self.server.origin, self.command, self.path, self.headers, body)
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))  # for HEAD: what the GET would send
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch


class Origin(ThreadingHTTPServer):
    """One listening port; tracks its connections so stop() can close keep-alive ones and join threads."""

    def __init__(self, hub: Hub, origin: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub, self.origin = hub, origin
        self.conns: dict[threading.Thread, socket.socket] = {}
        self.conns_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_conn, args=(request, client_address), name=f"hub-server-{self.origin}-conn", daemon=True
        )
        with self.conns_lock:
            self.conns[thread] = request
        thread.start()

    def _serve_conn(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the client went away (timeout, early close) or stop() closed the socket
        finally:
            with self.conns_lock:
                self.conns.pop(threading.current_thread(), None)
            self.shutdown_request(request)

    def close_connections(self, timeout: float) -> None:
        with self.conns_lock:
            conns = dict(self.conns)
        for sock in conns.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in conns:
            thread.join(timeout)
