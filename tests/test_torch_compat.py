"""What changes between torch releases, checked against the installed one.

opregistry resolves before ``import torch`` (``list``, ``doctor``, ``lock``)
and again, against the dispatcher, when torch is imported.  Both must reach
the same verdict on every supported release (pyproject.toml's range), so the
facts the resolver uses without torch -- the ``torch.Tag`` members, the
namespaces torch owns -- must be those of the installed torch
(tests/test_torch_state.py compares the tables themselves).  ``.ci/compat``
runs these on the oldest and the newest supported release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env={**os.environ, **env})


def _findings(*argv: str) -> list[tuple[str, str, str]]:
    proc = _run("-m", "opregistry", "doctor", "--json", *argv)
    assert proc.returncode in (0, 1), proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    return sorted((p["severity"], p["code"], p["message"]) for p in problems)


def test_doctor_without_torch_agrees_with_the_dispatcher():
    """`doctor` (no torch) finds what `doctor --live` (torch imported) finds, on this torch.

    On torch 2.8 the repository's nnkit declares an op with ``tags=["out"]``
    (a ``torch.Tag`` from 2.13): both must say so, or both must accept it.
    """
    assert _findings() == _findings("--live")


def test_supported_versions_page_states_the_declared_range():
    """docs/supported-versions.md states the torch and Python ranges the metadata declares."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "supported-versions.md").read_text()
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    [torch_range] = [re.sub(r"^torch", "", d).split(";")[0].strip()
                     for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert f"| torch | `{torch_range}` |" in page
    assert f"| Python | `{project['requires-python']}` |" in page
    for path in sorted((root / "plugins").glob("*/pyproject.toml")):
        deps = tomllib.loads(path.read_text())["project"]["dependencies"]
        assert f"torch{torch_range}" in deps, f"{path}: every backend declares the same range"
