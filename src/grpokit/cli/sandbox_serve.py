"""`grpokit sandbox-serve`: run model-written programs for code rewards on this machine, over HTTP.

    grpokit sandbox-serve --port 8130 --workers 8                                      # loopback
    grpokit sandbox-serve --host 0.0.0.0 --port 8130 --token SECRET --workers 8 --wall-seconds 10

The client is grpokit.sandbox.remote.RemoteSandbox (the same map / submit as SandboxPool). Every batch runs
in grpokit.sandbox's bwrap sandbox (--mode process: resource limits only) with this server's limits.
Access follows grpokit.serve_auth: beyond loopback the server refuses to start without a token (--token,
or $GRPOKIT_SERVE_TOKEN); with one, a request without `Authorization: Bearer <token>` gets 401.
"""

from __future__ import annotations

import argparse

from grpokit.errors import ConfigError
from grpokit.sandbox.limits import MODES, Limits
from grpokit.sandbox.remote import make_server
from grpokit.serve_auth import TOKEN_ENV, redacted, require_token, resolve_token


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpokit sandbox-serve",
                                description="Serve grpokit's code sandbox for code-task rewards.")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on; beyond loopback a token is "
                                                       "required")
    p.add_argument("--port", type=int, default=8130, help="0: a free port (printed)")
    p.add_argument("--token", default=None,
                   help=f"every request must send Authorization: Bearer TOKEN; default ${TOKEN_ENV} (none on "
                        "loopback)")
    p.add_argument("--workers", type=int, default=2, help="sandboxes running at once, across all requests")
    p.add_argument("--mode", choices=MODES, default="bwrap",
                   help="bwrap: isolated; process: resource limits only, no isolation")
    p.add_argument("--max-jobs", type=int, default=4096, help="jobs one request may carry")
    defaults = Limits()
    for name, value in vars(defaults).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value,
                       help=f"grpokit.sandbox.Limits.{name} of every run (default {value})")
    return p


def main(argv: list[str] | None = None) -> int:
    """Start the sandbox server and serve until interrupted (Ctrl-C: exit 0)."""
    args = parser().parse_args(argv)
    token = resolve_token(args.token)
    try:
        require_token(args.host, token, "grpokit sandbox-serve")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    limits = Limits(**{name: getattr(args, name) for name in vars(Limits())})
    server = make_server(args.host, args.port, token, workers=args.workers, limits=limits, mode=args.mode,
                         max_jobs=args.max_jobs)
    print(f"grpokit sandbox-serve: mode {args.mode}, {args.workers} workers on "
          f"http://{args.host}:{server.server_address[1]} (token: {redacted(token)})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
