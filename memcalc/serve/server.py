"""`memcalc serve`: the page and its JSON API on 127.0.0.1 (stdlib http.server, GET only).

Routes: / (the page), /app.js, /style.css (package data, memcalc/serve/static/), /api/options,
/api/answer?<state>, /api/changes?<state>. Bad input answers HTTP 400 {"error": the MemcalcError
line, "field": its field}. Nothing is fetched from elsewhere: the page's script and styles are
served from here, and the Content-Security-Policy forbids any other origin.

Latency: the engine caches one simulation per (model, regime) (memcalc.engine.run.candidates),
so a change of micro-batch or sequence length costs a few ms; a new regime (precision,
checkpointing, optimizer, ...) costs one simulation. After a new model is shown, a warmer thread
simulates the regimes one input away while the page is idle, so those changes answer from the
cache too (benchmarks/bench_serve.py measures each kind). It works after IDLE_S without a
request, one piece (a simulation) at a time, and stops with the server.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from memcalc.core.errors import MemcalcError, SpecError
from memcalc.serve import api

STATIC = {"/": ("page.html", "text/html; charset=utf-8"), "/app.js": ("app.js", "text/javascript"),
          "/style.css": ("style.css", "text/css")}
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"
ENGINE = threading.Lock()
"""One computation at a time: the engine's caches are shared, and two CPU-bound threads only slow
each other."""
WARM_FIELDS = ("precision", "checkpointing", "attention", "optimizer")
IDLE_S = 1.0
"""The warmer works after this long without a request (from the last one's end): a person
reading the answer, not one typing or clicking through options, whose next request would wait
for the simulation in hand."""


class Warmer(threading.Thread):
    """Simulates the regimes one input away from the model last answered, while no request runs."""

    def __init__(self):
        super().__init__(daemon=True, name="memcalc-serve-warmer")
        self.jobs: queue.LifoQueue = queue.LifoQueue()  # the latest state's neighbours first
        self.last_request = time.monotonic()
        self._warmed: set = set()
        self.stopped = False

    def stop(self) -> None:
        """End the thread after the piece in hand (the server is shutting down)."""
        self.stopped = True
        self.jobs.put(None)

    def after(self, q: dict[str, str]) -> None:
        """Queue the regimes one input away from a state's (each regime once)."""
        for name in WARM_FIELDS:
            for value in api.options()[name]:
                job = {**q, name: value}
                key = _regime_key(job)
                if key not in self._warmed:
                    self._warmed.add(key)
                    self.jobs.put(job)

    def run(self) -> None:
        from memcalc.queries.estimate import estimate

        while True:
            q = self.jobs.get()
            if q is None or self.stopped:
                return
            try:
                model, training = api.model_of(q), api.training_of(q)
            except (MemcalcError, ValueError):
                continue  # a neighbour the engine refuses: nothing to warm
            # in three pieces (the step's simulation, then each curve's shape classes), each
            # after an idle moment, so that a request waits for one piece at most
            for piece in (lambda: estimate(model, training), lambda: api.curve(model, training, "micro_batch"),
                          lambda: api.curve(model, training, "seq_len")):
                while time.monotonic() - self.last_request < IDLE_S and not self.stopped:  # requests first
                    time.sleep(0.05)
                if self.stopped:
                    return
                with ENGINE:
                    try:
                        piece()
                    except (MemcalcError, ValueError):
                        break


def _regime_key(q: dict[str, str]) -> tuple:
    """What the engine's cache is keyed on, less the shape: the state without micro_batch,
    seq_len and gpu.

    >>> _regime_key({"model": "gpt2", "micro_batch": "4", "precision": "bf16"})
    (('model', 'gpt2'), ('precision', 'bf16'))
    """
    return tuple(sorted((k, v) for k, v in q.items() if k not in ("micro_batch", "seq_len", "gpu")))


class Handler(BaseHTTPRequestHandler):
    """GET handler of the page and the API."""

    server_version = "memcalc-serve"
    warmer: Warmer | None = None
    quiet = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        try:
            self._get()
        finally:  # idle is counted from a request's end: a long one is not idle time
            if self.warmer is not None:
                self.warmer.last_request = time.monotonic()

    def _get(self) -> None:
        parts = urlsplit(self.path)
        if self.warmer is not None:
            self.warmer.last_request = time.monotonic()
        if parts.path in STATIC:
            name, kind = STATIC[parts.path]
            body = resources.files("memcalc.serve").joinpath("static", name).read_bytes()
            return self._send(200, body, kind)
        if parts.path == "/favicon.ico":
            return self._send(204, b"", "image/x-icon")
        route = {"/api/options": None, "/api/answer": api.answer, "/api/changes": api.changes_answer}
        if parts.path not in route:
            return self._json(404, {"error": f"path: no page at {parts.path[:60]!r}; fix: open /"})
        try:
            if route[parts.path] is None:
                return self._json(200, api.options())
            q = _query(parts.query)
            with ENGINE:
                out = route[parts.path](q)
            if self.warmer is not None and parts.path == "/api/answer":
                self.warmer.after(api.parse_query(q))
            return self._json(200, out)
        except MemcalcError as err:
            return self._json(400, {"error": str(err), "field": err.field})
        except Exception as err:  # one line for the page, not a traceback
            return self._json(500, {"error": f"internal error: {type(err).__name__}: {str(err)[:200]}"})

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload, default=str).encode(), "application/json")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        if not self.quiet:
            super().log_message(format, *args)


def _query(text: str) -> dict[str, str]:
    """The query string as {key: value}; a key given twice or a huge query is refused by name.

    >>> _query("model=gpt2&micro_batch=4")
    {'model': 'gpt2', 'micro_batch': '4'}
    """
    if len(text) > api.MAX_QUERY_CHARS:
        raise SpecError("query", f"{len(text):,} characters, above {api.MAX_QUERY_CHARS:,}",
                        "paste a smaller config.json")
    try:
        parsed = parse_qs(text, keep_blank_values=True, max_num_fields=64, strict_parsing=False)
    except ValueError as err:
        raise SpecError("query", str(err)[:80], "open / and start again") from None
    twice = [k for k, v in parsed.items() if len(v) > 1]
    if twice:
        raise SpecError(twice[0][:40], "is given twice", "give each input once")
    return {k: v[0] for k, v in parsed.items()}


class Server(ThreadingHTTPServer):
    """The HTTP server; shutdown() also ends its warmer."""

    daemon_threads = True
    warmer: Warmer | None = None

    def shutdown(self) -> None:
        """Stop serving, and stop warming."""
        super().shutdown()
        if self.warmer is not None:
            self.warmer.stop()


def start(port: int = 0, warm: bool = True, quiet: bool = True) -> Server:
    """A server on 127.0.0.1:`port` (0: a free port) answering in a daemon thread; its URL is
    f"http://127.0.0.1:{server.server_port}/". Stop it with server.shutdown().

    >>> s = start(warm=False); s.server_address[0]
    '127.0.0.1'
    >>> s.shutdown(); s.server_close()
    """
    warmer = Warmer() if warm else None
    if warmer is not None:
        warmer.start()
    handler = type("BoundHandler", (Handler,), {"warmer": warmer, "quiet": quiet})
    server = Server(("127.0.0.1", port), handler)
    server.warmer = warmer
    threading.Thread(target=server.serve_forever, daemon=True, name="memcalc-serve").start()
    return server
