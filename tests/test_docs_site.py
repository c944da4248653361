"""The documentation site (mkdocs.yml: docs/ and the API reference from the docstrings) builds with every
warning an error: a broken nav entry, a link to a missing page, or a docstring whose parameters do not
match its signature fails here."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the [dev] extra installs mkdocs-material and mkdocstrings-python")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(site)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    api = (site / "api" / "index.html").read_text()
    for name in ("sample_groups", "group_advantages", "per_token_logprobs", "grpo_objective_from_logprobs",
                 "train_step", "train_grpo"):                      # the chapter's blocks, from the docstrings
        assert 'id="grpokit.' in api and name in api, name
    assert (site / "index.html").is_file() and (site / "scaling" / "index.html").is_file()
    shutil.rmtree(site)
