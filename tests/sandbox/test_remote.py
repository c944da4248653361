"""grpokit sandbox-serve and RemoteSandbox: a batch round-trips, tokens hold, a gone server is one line.

The server runs bwrap where bubblewrap works here, else process mode (the HTTP side is the same).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from grpokit.cli.sandbox_serve import main as serve_main
from grpokit.errors import run_command
from grpokit.sandbox import Limits, SandboxUnavailable, check_sandbox
from grpokit.sandbox.remote import RemoteSandbox, make_server, parse_jobs
from grpokit.serve_auth import TOKEN_ENV

pytestmark = pytest.mark.filterwarnings("ignore::grpokit.sandbox.SandboxWarning")
FAST = Limits(cpu_seconds=1, wall_seconds=2)
JOBS = [("def f(x):\n    return x + 1", ["assert f(1) == 2", "assert f(2) == 3"]),
        ("def f(x):\n    return x", ["assert f(1) == 2", "assert f(0) == 0"]),
        ("raise SystemError('boom')", ["assert True"])]


def serving_mode() -> str:
    try:
        check_sandbox("bwrap")
    except SandboxUnavailable:
        return "process"
    return "bwrap"


@pytest.fixture()
def server():
    srv = make_server("127.0.0.1", 0, "s3cret", workers=2, limits=FAST, mode=serving_mode())
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def post(url: str, body: bytes, headers: dict) -> int:
    """The HTTP status of one POST."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as a:
            return a.status
    except urllib.error.HTTPError as e:
        return e.code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_batch_round_trips_in_order(server):
    _, url = server
    with RemoteSandbox(url, token="s3cret", timeout=30) as remote:
        results = remote.map(JOBS)
        one = remote.submit("x = 2", ["assert x == 2"]).result(timeout=30)
    assert [(r.outcome, r.passed, r.total) for r in results] == [("passed", 2, 2), ("failed", 1, 2),
                                                                  ("crash", 0, 1)]
    assert results[2].detail == "program: SystemError: boom (line 1)" and one.fraction == 1.0


def test_missing_or_wrong_token_gets_401(server):
    _, url = server
    body = json.dumps({"jobs": [["x = 1", []]]}).encode()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        assert post(url + "/run", body, headers) == 401
    with pytest.raises(PermissionError, match="--token"):
        RemoteSandbox(url, token="wrong", timeout=10).map(JOBS[:1])
    health = urllib.request.Request(url + "/health", headers={"Authorization": "Bearer s3cret"})
    with urllib.request.urlopen(health, timeout=10) as answer:
        assert json.loads(answer.read())["ok"] is True


def test_bad_batches_are_refused_with_400(server):
    _, url = server
    auth = {"Authorization": "Bearer s3cret"}
    assert post(url + "/run", b'{"jobs": [["x = 1", "not a list"]]}', auth) == 400
    assert post(url + "/run", b"not json", auth) == 400 and post(url + "/nowhere", b"{}", auth) == 404
    with pytest.raises(ValueError, match="at most 2"):
        parse_jobs(json.dumps({"jobs": [["a", []]] * 3}).encode(), max_jobs=2)
    assert parse_jobs(b'{"jobs": [["a", ["assert 1"]]]}', 8) == [("a", ["assert 1"])]


def test_beyond_loopback_without_a_token_is_refused_at_start(monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match="--token"):
        make_server("0.0.0.0", 0, "", mode="process")
    assert run_command(serve_main, ["--host", "0.0.0.0", "--port", "0", "--mode", "process"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: grpokit sandbox-serve --host 0.0.0.0") and err.count("\n") == 1


def test_a_gone_server_is_one_line_after_the_retries():
    start = time.monotonic()
    with pytest.raises(SandboxUnavailable) as e:
        RemoteSandbox(f"http://127.0.0.1:{free_port()}", token="", timeout=2, retries=2).map(JOBS[:1])
    assert "did not answer after 3 tries" in str(e.value) and "\n" not in str(e.value)
    assert 1.4 < time.monotonic() - start < 10          # waited 0.5 s + 1 s between the tries


def test_the_command_serves_until_interrupted(tmp_path):
    env = {**os.environ, TOKEN_ENV: "cli-token"}
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c",
                             "import sys; from grpokit.cli.sandbox_serve import main; "
                             "sys.exit(main(sys.argv[1:]))", "--port", "0", "--mode", "process",
                             "--wall-seconds", "3"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "token: set (9 characters)" in line and "cli-token" not in line
        url = line.split(" on ")[1].split()[0]
        with RemoteSandbox(url, token="cli-token", timeout=30) as remote:
            assert [r.outcome for r in remote.map(JOBS)] == ["passed", "failed", "crash"]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
