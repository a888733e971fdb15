"""``opregistry list``: the resolved view, as a table and as JSON, without torch."""

from __future__ import annotations

import json
import subprocess
import sys

from opregistry.cli import main


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)


def test_list_json_does_not_import_torch():
    """The whole `list --json` runs in a process where torch never gets imported."""
    code = (
        "import sys, io, contextlib\n"
        "from opregistry.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    rc = main(['list', '--json'])\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
        "print(buf.getvalue())\n"
    )
    proc = run("-c", code)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    names = {op["name"] for op in data["ops"]}
    assert {"tutorial::numpy_sin", "tutorial::muladd", "tutorial::add_out"} <= names
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["cpu"]["distribution"] == "opregistry-cpu"


def test_list_table_shows_origin_and_status(capsys):
    assert main(["list", "-n", "tutorial"]) == 0
    out = capsys.readouterr().out
    assert "tutorial::muladd(Tensor a, Tensor b, float c) -> Tensor" in out
    assert "[tutorial-ops==0.1.0]" in out
    assert "tutorial_ops.kernels:muladd_backward" in out


def test_list_filters_by_status(capsys):
    assert main(["list", "--json", "-s", "active", "-b", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    kernels = [k for op in data["ops"] for k in op["kernels"]]
    assert kernels and all(k["status"] == "active" and k["backend"] == "cpu" for k in kernels)


def test_python_dash_m_is_the_command():
    proc = run("-m", "opregistry", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "tutorial" in {n["name"] for n in json.loads(proc.stdout)["namespaces"]}
