"""Whether a sandbox mode can run here: `check_sandbox(mode)` raises SandboxUnavailable in one line if not.

bwrap: the `bwrap` program must exist and start this interpreter in the sandbox (probed once per process,
a fraction of a second; a failure is probed again next time, so installing bubblewrap mid-run works).
process: always available; it warns once per process that it is resource limits, not isolation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from functools import cache

from grpokit.sandbox.command import bwrap_argv, inside_env
from grpokit.sandbox.limits import Limits, SandboxUnavailable, check_mode

INSTALL = "install bubblewrap (apt-get install bubblewrap, or dnf install bubblewrap)"
FALLBACK = "or pass mode='process' (resource limits only, no isolation)"
USERNS = ("unprivileged user namespaces look disabled here: allow them "
          "(sysctl kernel.unprivileged_userns_clone=1, or kernel.apparmor_restrict_unprivileged_userns=0)")


class SandboxWarning(UserWarning):
    """A sandbox runs with less protection than its name suggests."""


def check_sandbox(mode: str = "bwrap") -> None:
    """Raise SandboxUnavailable (one line: what to install or change) when `mode` cannot run here.

    Args:
        mode: 'bwrap' (bubblewrap namespaces + limits) or 'process' (limits only: warns once).
    """
    if check_mode(mode) == "process":
        _warn_process_mode()
        return
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(f"the sandbox needs bubblewrap, and 'bwrap' is not on PATH: {INSTALL}, "
                                 f"{FALLBACK}")
    _probe_bwrap(path, os.geteuid() == 0)


@cache
def _warn_process_mode() -> None:
    warnings.warn("grpokit.sandbox mode='process' applies resource limits only, not isolation: the program "
                  "runs as your user and can read and write your files and reach the network; "
                  "use mode='bwrap' to isolate it", SandboxWarning, stacklevel=4)


@cache
def _probe_bwrap(path: str, as_root: bool) -> bool:
    """True once `path` (bwrap) has started this interpreter in a sandbox; SandboxUnavailable (not cached)
    if not."""
    argv = [path, *bwrap_argv(Limits(), as_root)[1:], sys.executable, "-I", "-c", "pass"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, env=inside_env("/"), check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(f"bubblewrap could not be run ({e}): {INSTALL}, {FALLBACK}") from e
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        said = lines[-1] if lines else f"exit status {done.returncode}"
        hint = USERNS if not as_root and ("namespace" in said or "not permitted" in said) else INSTALL
        raise SandboxUnavailable(f"bubblewrap cannot start a sandbox here ({said}): {hint}, {FALLBACK}")
    return True
