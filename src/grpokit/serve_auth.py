"""The access rule of grpokit's HTTP servers: a shared token whenever a server listens beyond loopback.

`grpokit vllm-serve` (grpokit.cli.vllm_serve) uses it, and a later `grpokit sandbox-serve` is meant to use
the same functions, so both servers follow one rule:

    listening on loopback (127.0.0.0/8, ::1, localhost)   a token is optional; when given it is enforced
    listening on any other host (0.0.0.0, ::, a LAN ip)    the server refuses to start without a token

The token comes from the command's --token flag, else the environment variable GRPOKIT_SERVE_TOKEN. Every
request carries it as `Authorization: Bearer <token>`; the server compares it in constant time
(`hmac.compare_digest`) and answers 401 otherwise. The token is never written to a log in full
(`redacted`).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import BinaryIO

TOKEN_ENV = "GRPOKIT_SERVE_TOKEN"
REFUSED = {"error": "missing or wrong token: send Authorization: Bearer <the server's --token>"}   # the 401

__all__ = ["REFUSED", "TOKEN_ENV", "auth_headers", "authorized", "drain", "is_loopback", "redacted",
           "require_token", "resolve_token", "JSONHandler"]


def is_loopback(host: str) -> bool:
    """Whether a listening address reaches this machine only: 'localhost', 127.0.0.0/8, ::1 (brackets and an
    IPv4-mapped ::ffff:127.x accepted). '' and '0.0.0.0' / '::' (every interface) and host names are not."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])      # fe80::1%eth0: the zone is no part of it
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def resolve_token(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The token to use: `given` (a --token flag, a config field) when set, else $GRPOKIT_SERVE_TOKEN, else ''
    (none)."""
    if given:
        return given.strip()
    return (os.environ if environ is None else environ).get(TOKEN_ENV, "").strip()


def require_token(host: str, token: str, command: str) -> None:
    """Raise ValueError (one line saying what to pass) when `command` would listen beyond loopback with no
    token."""
    if not token and not is_loopback(host):
        raise ValueError(f"{command} --host {host} listens beyond loopback and lets whoever reaches it drive "
                         f"the server: pass --token SECRET (or set {TOKEN_ENV}), or listen on 127.0.0.1")


def authorized(header: str | None, token: str) -> bool:
    """Whether an `Authorization` header value carries `token` (`Bearer <token>`, compared in constant time);
    always true when the server has no token (loopback only, `require_token`)."""
    if not token:
        return True
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def auth_headers(token: str) -> dict[str, str]:
    """The request header a client sends for `token` (none when there is no token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def redacted(token: str) -> str:
    """How a token appears in logs: never in full."""
    return f"set ({len(token)} characters)" if token else "none"


def drain(stream: BinaryIO, size: int) -> None:
    """Read and drop a request body of `size` bytes in 1 MiB pieces, none kept: a refused client still
    reads the answer instead of a reset connection."""
    while size > 0:
        piece = stream.read(min(size, 1 << 20))
        if not piece:
            return
        size -= len(piece)


class JSONHandler(BaseHTTPRequestHandler):
    """The request handler base of grpokit's servers: `_reply` answers a JSON body with its length."""

    def _reply(self, payload: object, code: int = 200) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
