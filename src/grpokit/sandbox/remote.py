"""The sandbox on another machine (or process): `grpokit sandbox-serve` and its client, RemoteSandbox.

    grpokit sandbox-serve --host 0.0.0.0 --port 8130 --token SECRET --workers 8        # the sandbox machine
    with RemoteSandbox("http://sandbox-host:8130", token="SECRET") as sandbox:         # the trainer
        results = sandbox.map([(program, tests), ...])     # as SandboxPool.map: Results in the jobs' order

The trainer's GPUs then never share a machine with model-written code. The server runs every batch through
one SandboxPool (its --workers bound the sandboxes running at once, across all requests); its Limits and
mode are the server's, not the client's to choose.

Access (grpokit.serve_auth, the rule of every grpokit server): on loopback a token is optional and enforced
when given; beyond loopback the server refuses to start without one. A request without the token gets 401.

Endpoints:
    GET  /health   {"ok": true, "mode": ..., "workers": ..., "limits": {...}}
    POST /run      {"jobs": [[program, [test, ...]], ...]} -> {"results": [Result as a dict, ...]}
                   at most --max-jobs jobs and 64 MiB a request (400 / 413 otherwise)
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from http.server import ThreadingHTTPServer

from grpokit.sandbox.limits import Limits, Result, SandboxUnavailable
from grpokit.sandbox.pool import SandboxPool
from grpokit.serve_auth import (
    REFUSED,
    TOKEN_ENV,
    JSONHandler,
    auth_headers,
    authorized,
    drain,
    require_token,
    resolve_token,
)

log = logging.getLogger("grpokit")
MAX_BODY = 64 << 20


class SandboxServer(ThreadingHTTPServer):
    """An HTTP server with the SandboxPool it runs batches on; server_close() stops the pool too."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, pool: SandboxPool) -> None:
        self.pool = pool
        super().__init__(address, handler)

    def server_close(self) -> None:
        super().server_close()
        self.pool.close(cancel=True)


def parse_jobs(body: bytes, max_jobs: int) -> list[tuple[str, list[str]]]:
    """The jobs of a /run body; ValueError (one line) when it is not {"jobs": [[str, [str, ...]], ...]}."""
    try:
        jobs = json.loads(body)["jobs"]
    except (ValueError, KeyError, TypeError):
        raise ValueError('the body must be JSON {"jobs": [[program, [test, ...]], ...]}') from None
    if not isinstance(jobs, list) or len(jobs) > max_jobs:
        raise ValueError(f"jobs must be a list of at most {max_jobs} [program, tests] pairs")
    for job in jobs:
        ok = isinstance(job, list) and len(job) == 2 and isinstance(job[0], str) and isinstance(job[1], list)
        if not ok or not all(isinstance(t, str) for t in job[1]):
            raise ValueError("each job must be [program: str, tests: list of str]")
    return [(program, tests) for program, tests in jobs]


def make_server(host: str = "127.0.0.1", port: int = 8130, token: str = "", *, workers: int = 2,
                limits: Limits = Limits(), mode: str = "bwrap", max_jobs: int = 4096) -> SandboxServer:
    """A sandbox server on host:port (port 0: a free one, server.server_address[1]); not yet serving.

    token: what every request's `Authorization: Bearer` must carry ('' = none: loopback only, else
    ValueError from grpokit.serve_auth.require_token). workers, limits, mode: the server's SandboxPool
    (SandboxUnavailable here when the mode cannot run on this machine).
    """
    require_token(host, token, "grpokit sandbox-serve")
    pool = SandboxPool(workers=workers, limits=limits, mode=mode)
    health = {"ok": True, "mode": mode, "workers": workers, "limits": asdict(limits)}

    class Handler(JSONHandler):
        def _body_or_refuse(self) -> bytes | None:
            """The request body, or None once 401 / 413 has been answered (the connection then closed)."""
            size = int(self.headers.get("Content-Length") or 0)
            allowed = authorized(self.headers.get("Authorization"), token)
            if allowed and size <= MAX_BODY:
                return self.rfile.read(size)
            self.close_connection = True
            drain(self.rfile, size if size <= MAX_BODY else 0)   # so the client sees the answer
            if allowed:
                self._reply({"error": f"a request may carry at most {MAX_BODY >> 20} MiB"}, 413)
            else:
                self._reply(REFUSED, 401)
            return None

        def do_GET(self) -> None:
            if self._body_or_refuse() is None:
                return
            self._reply(health if self.path == "/health" else {"error": "unknown path"},
                        200 if self.path == "/health" else 404)

        def do_POST(self) -> None:
            body = self._body_or_refuse()
            if body is None:
                return
            if self.path != "/run":
                self._reply({"error": f"unknown path {self.path}"}, 404)
                return
            try:
                jobs = parse_jobs(body, max_jobs)
            except ValueError as e:
                self._reply({"error": str(e)}, 400)
                return
            try:
                results = self.server.pool.map(jobs)
            except Exception as e:   # noqa: BLE001  (the client gets the reason, the server keeps serving)
                log.exception("sandbox-serve: a batch failed")
                self._reply({"error": f"{type(e).__name__}: {e}"}, 500)
                return
            self._reply({"results": [asdict(r) for r in results]})

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("sandbox-serve: " + fmt, *args)

    try:
        return SandboxServer((host, port), Handler, pool)
    except OSError as e:
        pool.close()
        raise SandboxUnavailable(f"grpokit sandbox-serve cannot listen on {host}:{port} ({e.strerror or e}): "
                                 "choose another --port or --host") from None


class RemoteSandbox:
    """Client of `grpokit sandbox-serve` with SandboxPool's interface (map, submit, close, `with`).

    Args:
        url: the server, e.g. http://sandbox-host:8130.
        token: the server's --token; None = $GRPOKIT_SERVE_TOKEN, '' = none.
        timeout: seconds to wait for one batch's answer (the server runs the whole batch first).
        retries: further tries after a failed one (no answer, 5xx), waiting 0.5 s, 1 s, 2 s, ... between;
            a 401 or 400 is not retried.
        workers: threads behind submit() (each submit is a batch of one job).
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 600.0, retries: int = 3,
                 workers: int = 4) -> None:
        self.url, self.timeout, self.retries = url.rstrip("/"), timeout, retries
        self.token = resolve_token(token) if token is None else token
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpokit-remote-sandbox")

    def map(self, jobs: list[tuple[str, list[str]]]) -> list[Result]:
        """Run every (program, tests) job on the server, in one request; Results in the jobs' order."""
        body = json.dumps({"jobs": [[program, list(tests)] for program, tests in jobs]}).encode()
        answer = self._post("/run", body)
        results = [Result(**r) for r in answer["results"]]
        if len(results) != len(jobs):
            raise SandboxUnavailable(f"the sandbox server at {self.url} answered {len(results)} results for "
                                     f"{len(jobs)} jobs: check that it is a grpokit sandbox-serve")
        return results

    def submit(self, program: str, tests: list[str]) -> Future[Result]:
        """One job, answered in the background; its Future gives the Result."""
        return self._executor.submit(lambda: self.map([(program, tests)])[0])

    def _post(self, path: str, body: bytes) -> dict:
        headers = {"Content-Type": "application/json", **auth_headers(self.token)}
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(0.5 * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url + path, data=body, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    return json.loads(answer.read())
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    raise PermissionError(f"the sandbox server at {self.url} refused the request (401): "
                                          f"pass its --token (or set {TOKEN_ENV})") from None
                if e.code < 500:
                    said = e.read().decode("utf-8", "replace")[:300]
                    raise SandboxUnavailable(f"the sandbox server at {self.url} refused the batch "
                                             f"({e.code}: {said})") from None
                last = e
            except (OSError, ValueError) as e:        # refused, reset, timed out, a half-sent answer
                last = e
        raise SandboxUnavailable(f"the sandbox server at {self.url} did not answer after {self.retries + 1} "
                                 f"tries ({last}): start it with `grpokit sandbox-serve` or fix the url")

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
