"""The `opregistry` command: every subcommand, its no-torch promise, and docs/cli.md."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # imported at collection, so that its autoload is not part of a test

from opregistry.cli import main

from . import per_version
from .conftest import BACKENDS, op_dist


@pytest.fixture
def healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repo's environment, healthy on every torch: where nnkit needs a newer torch
    (tests/per_version.py) its refusal is checked and it is blocked."""
    per_version.block_refused(monkeypatch)


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
    assert backends["cpu"]["distribution"] == {"name": "opregistry-cpu", "version": "0.1.0"}


def test_list_table_shows_origin_and_status(capsys, healthy):
    assert main(["list", "-n", "tutorial"]) == 0
    out = capsys.readouterr().out
    assert "tutorial::muladd(Tensor a, Tensor b, float c) -> Tensor" in out
    assert "[tutorial-ops==0.1.0]" in out
    assert "tutorial_ops.kernels:muladd_backward" in out


def test_list_filters_by_status(capsys, healthy):
    assert main(["list", "--json", "-s", "active", "-b", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    kernels = [k for op in data["ops"] for k in op["kernels"]]
    assert kernels and all(k["status"] == "active" and k["backend"] == "cpu" for k in kernels)


def test_python_dash_m_is_the_command(healthy):
    proc = run("-m", "opregistry", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "tutorial" in {n["name"] for n in json.loads(proc.stdout)["namespaces"]}


# -- every command ---------------------------------------------------------------

def define(name: str, extra: str = "") -> str:
    return f"lib.define('{name}(Tensor x) -> Tensor', kernels={{'cpu': 'KMOD:clone'}}{extra})\n"


def cli_json(capsys, *argv: str) -> tuple[int, object]:
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command", ["list", "plugins", "doctor", "lock", "verify", "show",
                                     "help", "completion"])
def test_command_does_not_import_torch(command, tmp_path, healthy):
    """list, show, plugins, doctor, lock, verify, help, completion never import torch."""
    lockfile = tmp_path / "opregistry.lock"
    argv = {"lock": ["lock", "-o", str(lockfile)], "verify": ["verify", str(lockfile)],
            "show": ["show", "muladd"], "help": ["help", "names"],
            "completion": ["completion", "--names"]}.get(command, [command])
    prepare = f"main(['lock', '-o', {str(lockfile)!r}])\n" if command == "verify" else ""
    code = (
        "import sys, io, contextlib\n"
        "from opregistry.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    {prepare or 'pass'}\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = main({argv!r})\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
        "print(buf.getvalue())\n"
        "sys.exit(rc)\n"
    )
    proc = run("-c", code)
    # exit 0 also says: the repo's own environment is healthy for every command
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip()
    if command == "lock":
        assert json.loads(lockfile.read_text())["fingerprint"].startswith("sha256:")


@pytest.mark.slow
def test_doctor_live_on_the_repo_environment_is_healthy():
    """A fresh process: torch imported, registry loaded, checked against the dispatcher: exit 0."""
    proc = run("-m", "opregistry", "doctor", "--live")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 error(s)" in proc.stdout and "--live' for those" not in proc.stdout


def scenario_two_def(dists, ns):
    a = op_dist(dists, "dist-a", ns, define("foo"))
    b = op_dist(dists, "dist-b", ns, define("bar"))
    return "namespace-conflict", {a, b}


def scenario_fragment_redefines(dists, ns):
    op_dist(dists, "owner", ns, define("foo"))
    return "op-conflict", {op_dist(dists, "frag", ns, define("foo"), kind="FRAGMENT")}


def scenario_two_kernels(dists, ns):
    op_dist(dists, "owner", ns, define("foo"))
    intruder = op_dist(dists, "intruder", ns, f"lib.impl('{ns}::foo', 'cpu', 'KMOD:twice')\n",
                       kind="IMPL")
    return "kernel-conflict", {intruder}


def scenario_undefined_op(dists, ns):
    stray = op_dist(dists, "stray", ns, f"lib.impl('{ns}::nope', 'cpu', 'KMOD:clone')\n",
                    kind="IMPL")
    return "kernel-for-undefined-op", {stray}


def scenario_missing_module(dists, ns):
    return "plugin-missing-module", {dists.make("ghost", ops={"ops": f"no_such_module_{ns}:lib"})}


def scenario_raising_plugin(dists, ns):
    mod = f"boom_{ns}"
    return "plugin-import-error", {dists.make("boom", ops={"ops": f"{mod}:lib"},
                                              modules={mod: "raise RuntimeError('kaput')\n"})}


def scenario_aten_add(dists, ns):
    evil = op_dist(dists, "evil", ns, "", kind="IMPL")
    mod = f"evil_{ns}"
    (dists.root / f"{mod}.py").write_text(
        "from opregistry import OpLibrary\nlib = OpLibrary('aten', 'IMPL')\n"
        f"lib.impl('add.Tensor', 'cpu', '{ns}_kernels:twice', override=True)\n")
    return "kernel-torch-op-denied", {evil}


SCENARIOS = [scenario_two_def, scenario_fragment_redefines, scenario_two_kernels,
             scenario_undefined_op, scenario_missing_module, scenario_raising_plugin,
             scenario_aten_add]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.replace("scenario_", ""))
def test_doctor_finds_each_conflict(scenario, dists, ns, scoped, capsys):
    """Each conflict of the core issue is an error naming the distribution; exit status 1."""
    code, culprits = scenario(dists, ns)
    op_dist(dists, "bystander", f"{ns}ok", define("fine", extra=", fake='KMOD:fake'"))
    scoped()
    rc, data = cli_json(capsys, "doctor")
    assert rc == 1
    found = [p for p in data["problems"] if p["code"] == code]
    assert found, [p["code"] for p in data["problems"]]
    assert {d["name"] for p in found for d in p["distributions"]} == culprits
    assert all(p["hint"] for p in found)
    assert data["summary"]["errors"] >= 1
    # the table says the same, with what to do
    assert main(["doctor"]) == 1
    text = capsys.readouterr().out
    assert f"ERROR   [{code}]" in text and "fix: " in text
    assert any(f"{c}==1.0" in text for c in culprits)


def test_list_shows_refused_kernels_as_conflict(dists, ns, scoped, capsys):
    """A second CPU kernel is listed under its op with status conflict and its distribution."""
    op_dist(dists, "owner", ns, define("foo"))
    intruder = op_dist(dists, "intruder", ns, f"lib.impl('{ns}::foo', 'cpu', 'KMOD:twice')\n",
                       kind="IMPL")
    scoped()
    rc, data = cli_json(capsys, "list", "-s", "conflict")
    assert rc == 1
    [op] = data["ops"]
    [row] = op["kernels"]
    assert (row["key"], row["status"]) == ("CPU", "conflict")
    assert row["distribution"] == {"name": intruder, "version": "1.0"}
    assert "kernel-conflict" in row["reason"]
    assert main(["list", "-n", ns]) == 1
    assert re.search(r"CPU\s+conflict\s+-\s+intruder==1.0", capsys.readouterr().out)


def test_doctor_warns_about_missing_fake_and_allowed_override(dists, ns, scoped, monkeypatch, capsys):
    """No fake kernel and an allowed override are warnings: reported, exit status 0."""
    op_dist(dists, "owner", ns, define("foo"))
    patch = op_dist(dists, "patch", ns,
                    f"lib.impl('{ns}::foo', 'cpu', 'KMOD:twice', override=True)\n", kind="IMPL")
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", ns)
    scoped()
    rc, data = cli_json(capsys, "doctor")
    assert rc == 0
    codes = {p["code"]: p for p in data["problems"]}
    assert "torch.compile" in codes["op-no-fake"]["message"]
    override = codes["kernel-overrides"]
    assert [(d["name"], d["version"]) for d in override["distributions"]] == [(patch, "1.0")]
    assert override["others"][0]["name"].startswith("owner")
    assert "OPREGISTRY_ALLOW_OVERRIDE" in override["hint"]


def test_an_import_that_fails_says_whether_the_module_is_missing_or_raised(dists, ns, scoped):
    """``--import`` of a package that is there but raises (built for another torch) is not
    told to install it; one that is not there is."""
    broken = f"broken_{ns}"
    (dists.root / f"{broken}.py").write_text("raise ImportError('undefined symbol: _ZN3c10')\n")
    scoped()
    with pytest.raises(SystemExit) as raised:
        main(["doctor", "--live", "--import", broken])
    assert f"its import raised: python -c 'import {broken}'" in str(raised.value)
    assert "undefined symbol" in str(raised.value) and "installed" not in str(raised.value)
    with pytest.raises(SystemExit) as missing:
        main(["doctor", "--live", "--import", f"{broken}_absent.sub"])
    assert "must be importable here (installed, or on PYTHONPATH)" in str(missing.value)


def test_doctor_live_finds_namespace_held_by_torch(dists, ns, scoped, capsys):
    """A namespace a module holds in torch (a DEF outside opregistry) is found with --live --import."""
    ext = f"ext_{ns}"
    (dists.root / f"{ext}.py").write_text(
        "import torch\n"
        f"lib = torch.library.Library({ns!r}, 'DEF')  # stands for a C++ TORCH_LIBRARY\n"
        "lib.define('native(Tensor x) -> Tensor')\n")
    dists.modules.append(ext)
    clash = op_dist(dists, "clash", ns, define("foo"))
    scoped()
    try:
        assert main(["doctor"]) == 0  # without torch, nothing to see
        capsys.readouterr()
        rc, data = cli_json(capsys, "doctor", "--live", "--import", ext)
        assert rc == 1 and data["summary"]["live"] is True, data
        [problem] = [p for p in data["problems"] if p["code"] == "namespace-held-by-torch"]
        assert [d["name"] for d in problem["distributions"]] == [clash]
        assert "FRAGMENT" in problem["hint"]
    finally:
        sys.modules[ext].lib._destroy()


def test_show_one_op(dists, ns, scoped, capsys):
    d = op_dist(dists, "shown", ns,
                "lib.define('foo(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'}, "
                "fake='KMOD:fake', tags=['pt2_compliant_tag'], samples='KMOD:clone', doc='hi')\n"
                "lib.define('foo.twice(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:twice'})\n")
    scoped()
    rc, shown = cli_json(capsys, "show", f"{ns}::foo")
    assert rc == 0 and shown["format_version"] == 1
    [data] = shown["ops"]
    assert data["schema"] == "foo(Tensor x) -> Tensor" and data["overloads"] == ["default", "twice"]
    assert data["features"]["fake"]["kernel"] == f"{ns}_kernels:fake"
    assert data["features"]["autograd"] is None
    assert data["samples"] == f"{ns}_kernels:clone" and data["doc"] == "hi"
    assert main(["show", f"{ns}::foo.twice"]) == 0
    text = capsys.readouterr().out
    assert f"{ns}::foo.twice(Tensor x) -> Tensor" in text
    assert f"{ns}_kernels:twice" in text and f"{d}==1.0" in text
    assert "fake:          no" in text


def test_show_a_torch_op_with_a_kernel_added_under_policy(dists, ns, scoped, monkeypatch, capsys):
    """aten::add.Tensor is torch's; show lists the kernel a package adds to it, and from where."""
    mod = f"patch_{ns}"
    patch = dists.make("aten-patch", ops={"ops": f"{mod}:lib"}, modules={
        mod: "from opregistry import OpLibrary\nlib = OpLibrary('aten', 'IMPL')\n"
             f"lib.impl('add.Tensor', 'cpu', '{ns}_k:sub', override=True)\n"})
    scoped()
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", "aten")
    rc, data = cli_json(capsys, "show", "aten::add.Tensor")
    assert rc == 0 and data["ops"] == []
    [kernel] = data["external_kernels"]
    assert (kernel["key"], kernel["kernel"], kernel["distribution"]) == (
        "CPU", f"{ns}_k:sub", {"name": patch, "version": "1.0"})
    assert kernel["overrides"]["name"] == "torch"


def test_show_unknown_or_left_out_op(dists, ns, scoped, capsys):
    op_dist(dists, "dist-a", ns, define("foo"))
    op_dist(dists, "dist-b", ns, define("bar"))
    scoped()
    assert main(["show", f"{ns}::foo"]) == 1  # declared, but left out: a problem
    err = capsys.readouterr().err
    assert f"{ns}::foo is not in the registry: it was left out" in err
    assert "namespace-conflict" in err
    assert main(["show", f"{ns}x::nope"]) == 2  # nobody declared it: a usage error
    assert f"no op {ns}x::nope in the registry" in capsys.readouterr().err


def test_plugins_shows_contributions_and_skipped(dists, ns, scoped, monkeypatch, capsys):
    good = op_dist(dists, "good", ns, define("foo"))
    blocked = op_dist(dists, "blocked", f"{ns}b", define("bar"))
    mod = f"boom_{ns}"
    boom = dists.make("boom", ops={"ops": f"{mod}:lib"}, modules={mod: "raise RuntimeError('kaput')\n"})
    scoped()
    monkeypatch.setenv("OPREGISTRY_BLOCK", blocked)
    rc, data = cli_json(capsys, "plugins")
    assert rc == 1  # boom failed
    by = {r["distribution"]["name"]: r for r in data["plugins"]}
    assert by[good]["status"] == "loaded"
    assert by[good]["contributes"]["ops"] == [f"{ns}::foo"]
    assert by[good]["contributes"]["namespaces"] == [f"{ns} (DEF)"]
    assert by[blocked]["status"] == "skipped" and "OPREGISTRY_BLOCK" in by[blocked]["reason"]
    assert by[boom]["status"] == "failed" and "kaput" in by[boom]["reason"]
    # CPU, and the kernels for every device (CompositeExplicitAutograd / ImplicitAutograd)
    assert by["opregistry-cpu"]["contributes"]["backends"][0]["keys"] == [
        "CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd"]
    assert by[good]["hooks"] == ["opregistry_kernels", "opregistry_namespaces", "opregistry_ops"]
    assert {"opregistry_backends", "opregistry_materialize_kernel"} <= set(
        by["opregistry-cpu"]["hooks"])
    assert main(["plugins"]) == 1
    text = capsys.readouterr().out
    assert "Op packages (entry-point group opregistry.ops)" in text and "kaput" in text


def test_list_live_shows_ops_registered_outside(dists, ns, scoped, capsys):
    """--live puts the dispatcher's view next to the declarations, outsiders included."""
    op_dist(dists, "lived", ns, define("foo", extra=", fake='KMOD:fake'"))
    scoped()
    import opregistry

    opregistry.load()
    outside = torch.library.Library(ns, "FRAGMENT")
    try:
        outside.define("native(Tensor x) -> Tensor")
        outside.impl("native", lambda x: x + 1, "CPU")
        rc, data = cli_json(capsys, "list", "--live", "-n", ns)
        assert rc == 0
        rows = {r["op"]: r for r in data["live"][ns]}
        assert rows[f"{ns}::foo"]["declared"] and rows[f"{ns}::foo"]["in_dispatcher"]
        assert {"CPU", "Meta"} <= set(rows[f"{ns}::foo"]["dispatcher_keys"])
        assert rows[f"{ns}::native"]["declared"] is False
        assert list(rows[f"{ns}::native"]["dispatcher_keys"]) == ["CPU"]
        assert main(["list", "--live", "-n", ns]) == 0
        text = capsys.readouterr().out
        assert "registered outside opregistry" in text and "matches" in text
        assert main(["show", "--live", f"{ns}::foo"]) == 0
        assert f"schema: {ns}::foo(Tensor x) -> Tensor" in capsys.readouterr().out
    finally:
        outside._destroy()


def test_lock_and_verify_commands(dists, ns, scoped, tmp_path, monkeypatch, capsys):
    a = op_dist(dists, "locked-a", ns, define("foo"))
    b = op_dist(dists, "locked-b", f"{ns}b", define("bar"))
    scoped()
    lockfile = tmp_path / "reg.lock"
    assert main(["lock", "-o", str(lockfile)]) == 0
    assert "sha256:" in capsys.readouterr().out
    assert main(["verify", str(lockfile)]) == 0
    assert "OK" in capsys.readouterr().out
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join([*BACKENDS, a]))
    rc, data = cli_json(capsys, "verify", str(lockfile))
    assert rc == 1 and data["ok"] is False
    assert f"distribution {b}==1.0: in the lockfile, missing from this environment" in data["differences"]
    assert main(["verify", str(lockfile)]) == 1
    assert f"op {ns}b::bar" in capsys.readouterr().err
    assert main(["lock", "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["distributions"] == {
        **{n: "0.1.0" for n in BACKENDS}, a: "1.0"}


def test_lock_refuses_a_broken_registry(dists, ns, scoped, tmp_path, capsys):
    op_dist(dists, "dist-a", ns, define("foo"))
    op_dist(dists, "dist-b", ns, define("bar"))
    scoped()
    lockfile = tmp_path / "reg.lock"
    assert main(["lock", "-o", str(lockfile)]) == 1
    assert "--force" in capsys.readouterr().err and not lockfile.exists()
    assert main(["lock", "-o", str(lockfile), "--force"]) == 0
    assert json.loads(lockfile.read_text())["excluded"] == ["dist-a==1.0", "dist-b==1.0"]


def test_help_names_every_command():
    proc = run("-m", "opregistry", "--help")
    assert proc.returncode == 0
    for command in ("list", "show", "plugins", "doctor", "check", "lock", "verify"):
        assert f"    {command} " in proc.stdout
    assert run("-m", "opregistry", "nope").returncode == 2


# -- docs/cli.md -----------------------------------------------------------------

CLI_DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
COMMANDS = ("list", "show", "plugins", "doctor", "check", "lock", "verify", "cache", "help",
            "completion")


def doc_blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", CLI_DOC.read_text(), re.S | re.M)


def real_help(command: str) -> str:
    proc = run("-m", "opregistry", *([command] if command else []), "--help",
               env={**os.environ, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.rstrip()


def test_cli_reference_is_the_real_help():
    """Every `$ opregistry ... --help` block of docs/cli.md is what the command prints."""
    documented = {}
    for block in doc_blocks("text"):
        first, _, rest = block.partition("\n")
        match = re.fullmatch(r"\$ opregistry (?:(\w+) )?--help", first)
        if match:
            documented[match.group(1) or ""] = rest.rstrip()
    assert set(documented) == {"", *COMMANDS}, "docs/cli.md documents every command's --help"
    for command, text in documented.items():
        assert text == real_help(command), (
            f"docs/cli.md is out of date for 'opregistry {command} --help'; paste:\n"
            f"{real_help(command)}")


def doc_block(lang: str, contains: str) -> str:
    """The one ``lang`` block of docs/cli.md that contains ``contains``."""
    [block] = [b for b in doc_blocks(lang) if contains in b]
    return block


def test_cli_doc_lockfile_example_runs(tmp_path):
    """The verify_lock example of docs/cli.md runs and prints what the page says."""
    example = doc_block("python", "verify_lock")
    proc = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("registry sha256:")
    assert "distribution opregistry-vmap==0.1.0: in the lockfile, missing from this environment" in lines
    assert (tmp_path / "opregistry.lock").exists()


def test_cli_doc_report_example_runs(tmp_path):
    """The opregistry.report example of docs/cli.md prints the lines the page shows."""
    code = doc_block("python", "from opregistry import report")
    expected = doc_block("text", "fake kernel:")
    env = {**os.environ, "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, "tutorial-ops"])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected.splitlines()


def test_report_functions_are_what_json_prints(capsys):
    """`list`, `plugins` and `doctor --json` print the report module's dicts, nothing else."""
    from opregistry import plan, report

    current = plan()
    for argv, data in ((["list"], report.list_report(current)),
                       (["plugins"], report.plugins_report(current)),
                       (["doctor"], report.doctor_report(current))):
        assert cli_json(capsys, *argv)[1] == json.loads(json.dumps(data, default=str))


def is_part_of(excerpt: object, whole: object) -> bool:
    """Whether every key and value of ``excerpt`` is in ``whole`` (recursively, for dicts)."""
    if isinstance(excerpt, dict):
        return isinstance(whole, dict) and all(
            k in whole and is_part_of(v, whole[k]) for k, v in excerpt.items())
    return excerpt == whole


def pinned_torch() -> str:
    """The torch version requirements-dev.txt pins (the one the docs are written against)."""
    text = (CLI_DOC.parent.parent / "requirements-dev.txt").read_text()
    [version] = re.findall(r"^torch==(\S+)$", text, re.M)
    return version


def test_cli_doc_lockfile_excerpt_is_real(capsys, healthy):
    """The JSON excerpt in docs/cli.md is part of what `opregistry lock -o -` writes here.

    Its torch version is the pinned one; under another torch (the compatibility
    runs of .ci/compat) the lock holds that torch's version, without build label.
    """
    excerpt = json.loads(doc_block("json", "lock_version"))
    assert excerpt["torch"] == pinned_torch()
    assert main(["lock", "-o", "-"]) == 0
    locked = json.loads(capsys.readouterr().out)
    assert locked["torch"] == torch.__version__.split("+")[0]
    excerpt = {**excerpt, "torch": locked["torch"]}
    assert is_part_of(excerpt, locked)
    assert not is_part_of({**excerpt, "lock_version": excerpt["lock_version"] + 1}, locked)


@pytest.mark.slow
def test_cli_doc_torchrun_example_runs(tmp_path):
    """check_ranks.py of docs/cli.md under torchrun, 2 ranks on the loopback: both agree."""
    script = doc_block("python", "verify_consistent")
    (tmp_path / "check_ranks.py").write_text(script)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo",
           "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, "tutorial-ops"])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "check_ranks.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the two ranks share one stdout: their lines may interleave, so match, do not split
    ranks = dict(re.findall(r"rank ([01]): (sha256:[0-9a-f]{64})", proc.stdout))
    assert set(ranks) == {"0", "1"} and ranks["0"] == ranks["1"], proc.stdout


def test_list_into_a_closed_pipe_is_quiet():
    """`opregistry list | head -1` ends without a BrokenPipeError traceback.

    The pipe's reading end is closed before the child starts, so its very
    first write fails (EPIPE): the child does write into a closed pipe, however
    little it prints -- reading a line and then closing, as ``head`` does,
    would let a short listing fit whole in the pipe's buffer and never fail.
    """
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # `head` already gone
    try:
        proc = subprocess.run([sys.executable, "-m", "opregistry", "list"], stdout=write,
                              stderr=subprocess.PIPE, timeout=120,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "BrokenPipeError" not in err and "Traceback" not in err and "Exception" not in err


# -- issue 17: one command line, one JSON, text that fits ------------------------------------


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_version_and_global_options_before_or_after_the_command(capsys, healthy):
    """--version exits 0; -v and --wide work before and after the command."""
    proc = run("-m", "opregistry", "--version")
    assert proc.returncode == 0 and proc.stdout.startswith("opregistry "), proc.stderr
    for argv in (["-v", "list", "--json"], ["list", "-v", "--json"], ["list", "--wide", "-v"],
                 ["--wide", "doctor"]):
        assert main(argv) == 0, argv
    capsys.readouterr()


@pytest.mark.parametrize("argv, meant", [(["lsit"], "'list'"), (["doctr", "-a"], "'doctor'"),
                                         (["-v", "plugin"], "'plugins'")])
def test_mistyped_command_gets_a_suggestion(argv, meant, capsys):
    assert main(argv) == 2
    assert f"did you mean {meant}?" in capsys.readouterr().err


@pytest.mark.parametrize("spelling", ["muladd", "tutorial::muladd", "tutorial.muladd",
                                      "torch.ops.tutorial.muladd",
                                      "torch.ops.tutorial.muladd.default"])
def test_show_accepts_every_spelling_of_an_op(spelling, capsys):
    rc, data = cli_json(capsys, "show", spelling)
    assert rc == 0
    assert [op["name"] for op in data["ops"]] == ["tutorial::muladd"]


def test_an_ambiguous_name_lists_its_candidates(dists, ns, scoped, capsys):
    """`foo` defined by two namespaces: show and check refuse it, naming both; exit 2."""
    op_dist(dists, "one", ns, define("foo"))
    op_dist(dists, "two", f"{ns}b", define("foo"))
    scoped()
    assert main(["show", "foo"]) == 2
    err = capsys.readouterr().err
    assert f"{ns}::foo" in err and f"{ns}b::foo" in err and "ambiguous" in err
    assert main(["check", "foo", "-q"]) == 2
    assert f"{ns}b::foo" in capsys.readouterr().err
    assert main(["show", f"{ns}b.foo", "--json"]) == 0  # unambiguous once qualified


def test_unknown_op_is_a_usage_error_with_a_suggestion(capsys):
    """show and check agree: an op nobody declared exits 2, with the closest name."""
    for argv in (["show", "tutorial::muladd_"], ["check", "tutorial::muladd_", "-q"]):
        assert main(argv) == 2, argv
        assert "did you mean 'tutorial::muladd'?" in capsys.readouterr().err
    assert main(["show", "torch.ops.tutorial.mulad"]) == 2
    assert "did you mean 'tutorial::muladd'?" in capsys.readouterr().err


def doc_table(heading: str) -> list[list[str]]:
    """The rows of the first markdown table after ``heading`` in docs/cli.md."""
    lines = CLI_DOC.read_text().split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[start + 2:end]]


def test_exit_status_table_is_the_code_and_every_command_follows_it(tmp_path, capsys):
    """docs/cli.md's exit status table is cli.EXIT_CODES; usage errors of every kind exit 2."""
    from opregistry.cli import EXIT_CODES

    assert {int(code): meaning for code, meaning in doc_table("### Exit status")} == EXIT_CODES
    for argv in (["nope"], ["list", "--no-such-option"], ["list", "-s", "bogus"],
                 ["show", "nosuch::op"], ["check", "nosuch::op", "-q"], ["help", "nosuch"],
                 ["completion", "tcsh"], ["completion"]):
        assert main(argv) == 2, argv
    capsys.readouterr()


def test_every_case_the_exit_table_names(tmp_path, capsys, monkeypatch, dists, ns):
    """Each case the rows of the exit table list exits as the table says (0, 1 and 2)."""
    from .conftest import op_dist

    for text in (None, "{not json", json.dumps({"lock_version": 3}), json.dumps({"x": 1})):
        lockfile = tmp_path / f"unusable{hash(text)}.lock"
        if text is not None:
            lockfile.write_text(text)
        assert main(["verify", str(lockfile)]) == 1, text
        assert main(["verify", "--json", str(lockfile)]) == 1, text
    assert main(["lock", "-o", str(tmp_path / "no" / "such" / "dir.lock")]) == 2
    assert "cannot write" in capsys.readouterr().err
    op_dist(dists, "broken", ns, "lib.define('f(Tensr x) -> Tensor')\n")
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join([*BACKENDS, *dists.names]))
    assert main(["lock", "-o", str(tmp_path / "errors.lock")]) == 1  # errors, no --force
    assert main(["lock", "--force", "-o", str(tmp_path / "errors.lock")]) == 0
    monkeypatch.setenv("OPREGISTRY_STRICT", "ture")
    for argv in (["list"], ["show", "x::y"], ["plugins"], ["lock", "-o", "-"],
                 ["verify", str(tmp_path / "errors.lock")]):
        assert main(argv) == 2, argv
    assert main(["doctor"]) == 1
    capsys.readouterr()


# The JSON schema of docs/cli.md, and a validator for it


def doc_schemas() -> dict[str, object]:
    text = CLI_DOC.read_text()
    found = re.findall(r"^<!-- schema: (\w+) -->\n```json\n(.*?)^```$", text, re.S | re.M)
    return {name: json.loads(body) for name, body in found}


def schema_errors(value: object, schema: object, types: dict, where: str = "$") -> list[str]:
    """Where ``value`` differs from ``schema`` (the notation of docs/cli.md, JSON output)."""
    if isinstance(schema, str):
        nullable = schema.endswith("?")
        kind = schema.rstrip("?")
        if value is None:
            return [] if nullable or kind == "any" else [f"{where}: null, expected {schema}"]
        if kind in types:
            return schema_errors(value, types[kind], types, where)
        expected = {"string": str, "int": int, "bool": bool, "any": object}[kind]
        ok = isinstance(value, expected) and not (kind == "int" and isinstance(value, bool))
        return [] if ok else [f"{where}: {value!r} is not {kind}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, expected a list"]
        return [e for i, v in enumerate(value) for e in schema_errors(v, schema[0], types,
                                                                      f"{where}[{i}]")]
    assert isinstance(schema, dict)
    if not isinstance(value, dict):
        return [f"{where}: {type(value).__name__}, expected an object"]
    if "*" in schema:
        return [e for k, v in value.items() for e in schema_errors(v, schema["*"], types,
                                                                   f"{where}.{k}")]
    keys = {k.rstrip("?"): k for k in schema}
    errors = [f"{where}: unexpected key {k!r}" for k in value if k not in keys]
    errors += [f"{where}: missing key {k!r}" for k, spelled in keys.items()
               if k not in value and not spelled.endswith("?")]
    return errors + [e for k, v in value.items() if k in keys
                     for e in schema_errors(v, schema[keys[k]], types, f"{where}.{k}")]


def test_json_schema_validator_bites():
    """The validator refuses the old shapes: plugins as a list, a distribution as a string."""
    schemas = doc_schemas()
    types = schemas["types"]
    assert schema_errors([], schemas["plugins"], types)
    assert schema_errors({"format_version": 1, "summary": {}, "problems": []},
                         schemas["doctor"], types)
    kernel = {"op": "a::b", "key": "CPU", "status": "active", "kind": "device", "kernel": "m:f",
              "setup_context": None, "backend": "cpu", "reason": "", "override": False,
              "overrides": None, "distribution": {"name": "a", "version": "1"}}
    assert not schema_errors(kernel, "kernel", types)
    assert schema_errors({**kernel, "distribution": "a==1"}, "kernel", types)


NAME_EQ_VERSION = re.compile(r"^[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+$")


def bare_distributions(value: object) -> list[str]:
    """Every string of ``value`` that is a distribution spelled ``name==version``."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in bare_distributions(v)]
    if isinstance(value, list):
        return [s for v in value for s in bare_distributions(v)]
    return [value] if isinstance(value, str) and NAME_EQ_VERSION.match(value) else []


def test_every_command_json_matches_the_documented_schema(dists, ns, scoped, monkeypatch,
                                                          tmp_path, capsys):
    """Real output of every --json command (overrides, refusals, a failed plugin included)."""
    op_dist(dists, "owner", ns, define("foo"))
    op_dist(dists, "patch", ns, f"lib.impl('{ns}::foo', 'cpu', 'KMOD:twice', override=True)\n",
            kind="IMPL")
    op_dist(dists, "intruder", ns, f"lib.impl('{ns}::foo', 'meta', 'KMOD:twice')\n"
            f"lib.impl('{ns}::foo', 'meta', 'KMOD:clone')\n", kind="IMPL")
    mod = f"boom_{ns}"
    dists.make("boom", ops={"ops": f"{mod}:lib"}, modules={mod: "raise RuntimeError('kaput')\n"})
    scoped()
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", ns)
    schemas = doc_schemas()
    types = schemas.pop("types")
    lockfile = tmp_path / "reg.lock"
    assert main(["lock", "-o", str(lockfile), "--force"]) in (0, 1)
    capsys.readouterr()
    outputs = {
        "list": cli_json(capsys, "list")[1],
        "list --live": cli_json(capsys, "list", "--live", "-n", ns)[1],
        "show": cli_json(capsys, "show", f"{ns}::foo")[1],
        "show --live": cli_json(capsys, "show", "--live", f"{ns}::foo")[1],
        "plugins": cli_json(capsys, "plugins")[1],
        "doctor": cli_json(capsys, "doctor", "-a")[1],
        "check": cli_json(capsys, "check", ns, "-q")[1],
        "verify": cli_json(capsys, "verify", str(lockfile))[1],
        "verify (differs)": cli_json(capsys, "verify", str(tmp_path / "missing.lock"))[1],
    }
    assert outputs["list"]["ops"][0]["kernels"], "the scenario lists kernels"
    assert any(k["overrides"] for op in outputs["list"]["ops"] for k in op["kernels"])
    assert any(p["others"] for p in outputs["doctor"]["problems"])
    assert {p["status"] for p in outputs["plugins"]["plugins"]} >= {"loaded", "failed"}
    assert set(schemas) == {"list", "show", "plugins", "doctor", "check", "verify"}
    for label, data in outputs.items():
        assert data["format_version"] == 1, label
        assert schema_errors(data, schemas[label.split()[0]], types) == [], label
        assert bare_distributions(data) == [], f"{label}: a distribution as 'name==version'"


# Text output


def kernel_columns(text: str) -> set[tuple[int, int]]:
    """Where the STATUS and KERNEL columns start on each kernel row of `list`."""
    starts = set()
    for line in text.splitlines():
        m = re.match(r"^ {6}(\S+ +)(\S+ +)\S", line)
        if m:
            starts.add((6 + len(m.group(1)), 6 + len(m.group(1)) + len(m.group(2))))
    return starts


def test_list_columns_line_up_across_ops(capsys, healthy):
    assert main(["list"]) == 0
    starts = kernel_columns(capsys.readouterr().out)
    assert len(starts) == 1, starts


def test_text_fits_the_terminal_width_unless_wide(healthy):
    env = {**os.environ, "COLUMNS": "70"}
    narrow = run("-m", "opregistry", "list", env=env)
    assert narrow.returncode == 0, narrow.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 70
    assert "tutorial::muladd(Tensor a, Tensor b, float c) -> Tensor" in narrow.stdout
    wide = run("-m", "opregistry", "list", "--wide", env=env)
    assert max(map(len, wide.stdout.splitlines())) > 70
    env.pop("COLUMNS")
    piped = run("-m", "opregistry", "list", env=env)  # a pipe, no COLUMNS: whole lines
    assert piped.stdout == wide.stdout


def test_color_on_a_terminal_only_and_never_with_no_color(dists, ns, scoped, monkeypatch):
    op_dist(dists, "dist-a", ns, define("foo"))
    op_dist(dists, "dist-b", ns, define("bar"))
    scoped()
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    for env, colored in ((None, True), ("1", False)):
        if env:
            monkeypatch.setenv("NO_COLOR", env)
        tty = Tty()
        monkeypatch.setattr(sys, "stdout", tty)
        assert main(["doctor"]) == 1
        assert ("\x1b[" in tty.getvalue()) is colored
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.delenv("NO_COLOR")
    assert main(["doctor"]) == 1
    assert "\x1b[" not in sys.stdout.getvalue()


def test_check_progress_is_redrawn_on_a_terminal_and_silent_otherwise(dists, ns, scoped,
                                                                       monkeypatch, capsys):
    op_dist(dists, "quiet", ns, define("foo") + define("bar"))
    scoped()
    assert main(["check", ns]) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal: no progress at all
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["check", ns]) == 0
    progress = tty.getvalue()
    assert progress.count("\r") >= 3 and "\n" not in progress, repr(progress)
    assert f"{ns}::foo" in progress and progress.endswith("\r\x1b[K")


# help topics and completion


def test_help_topics_are_the_docs_sections():
    """opregistry/help/*.md is what docs/ marks as topics (regenerate: python -m opregistry.helptopics)."""
    from opregistry import helptopics

    fresh = helptopics.generate(CLI_DOC.parent)
    shipped = {name: (Path(helptopics.__file__).parent / "help" / f"{name}.md").read_text()
               for name in helptopics.names()}
    assert shipped == fresh, "run: python -m opregistry.helptopics"
    assert {"exit-codes", "names", "json", "output", "completion"} <= set(fresh)


def test_help_command(capsys):
    assert main(["help"]) == 0
    listing = capsys.readouterr().out
    assert "exit-codes" in listing and "https://opregistry.github.io/opregistry/" in listing
    assert main(["help", "names"]) == 0
    out = capsys.readouterr().out
    assert "torch.ops.mylib.rms_norm" in out and "cli/#naming-an-op" in out
    assert main(["help", "show"]) == 0
    assert "usage: opregistry show" in capsys.readouterr().out
    assert main(["help", "exit-code"]) == 2
    assert "did you mean 'exit-codes'?" in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script_is_produced(shell, capsys):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    option = "-l {}" if shell == "fish" else "--{}"
    for word in ("list", "show", "doctor", option.format("json"), option.format("namespace"),
                 "inactive"):
        assert word in script, (shell, word)
    import shutil

    checker = {"bash": ["bash", "-n"], "zsh": ["zsh", "-n"], "fish": ["fish", "--no-execute"]}
    exe = shutil.which(checker[shell][0])
    if exe is None:
        assert shell != "bash", "bash is needed to check the bash script"
        return
    proc = subprocess.run([*checker[shell], "/dev/stdin"], input=script, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def complete(line: str) -> list[str]:
    """What the bash completion script offers for ``line`` (the cursor at its end)."""
    proc = subprocess.run([sys.executable, "-m", "opregistry", "completion", "bash"],
                          capture_output=True, text=True, check=True)
    words = line.split(" ")
    driver = (proc.stdout + f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
              f"COMP_CWORD={len(words) - 1}\n_opregistry\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completion_completes_commands_options_and_ops():
    assert complete("opregistry li") == ["list"]
    assert "--namespace" in complete("opregistry list --na")
    assert complete("opregistry list -s inac") == ["inactive"]
    assert "tutorial::muladd" in complete("opregistry show tutorial::mu")
    assert "exit-codes" in complete("opregistry help ex")


_LOGS = (
    "import sys\n"
    "from opregistry.logs import configure, get_logger\n"
    "applied = []\n"
    "def apply():\n"
    "    import logging\n"
    "    handler = logging.StreamHandler(sys.stderr)\n"
    "    handler.setFormatter(logging.Formatter('%(message)s'))\n"
    "    logger = logging.getLogger('opregistry')\n"
    "    logger.addHandler(handler)\n"
    "    logger.setLevel(logging.ERROR)\n"
    "    logger.propagate = False\n"
    "    applied.append(1)\n"
    "log = get_logger()\n"
)


def _logs(body: str) -> subprocess.CompletedProcess:
    """Run ``body`` after :data:`_LOGS` in a fresh interpreter; it must exit 0."""
    proc = run("-c", _LOGS + body)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_logging_is_imported_when_an_event_may_be_shown():
    """The CLI's configuration (errors only) waits for the first event it would show:
    warnings and info are dropped without importing logging or structlog; an error applies
    the configuration and is shown."""
    proc = _logs(
        "configure(40, apply)\n"
        "log.warning('dropped-warning'); log.info('dropped-info'); log.debug('dropped-debug')\n"
        "print('before', 'logging' in sys.modules, 'structlog' in sys.modules, applied)\n"
        "log.error('shown-error', key=1)\n"
        "print('after', 'logging' in sys.modules, applied)\n")
    assert proc.stdout.splitlines() == ["before False False []", "after True [1]"]
    assert "shown-error" in proc.stderr and "dropped" not in proc.stderr, proc.stderr


def test_a_deferred_configuration_applies_once_logging_is_imported():
    """When something else imports logging (torch does) after the CLI deferred its
    configuration, the next event of any level applies it first: a warning is not shown
    through logging's last-resort handler."""
    proc = _logs(
        "configure(40, apply)\n"
        "import logging\n"
        "log.warning('dropped-warning')\n"
        "print(applied)\n")
    assert proc.stdout.split() == ["[1]"] and "dropped" not in proc.stderr, proc.stderr


def test_unconfigured_logging_shows_warnings_as_before():
    """Without a configuration (a library user's process), a warning reaches stderr through
    logging's last resort and a debug event is dropped without importing logging."""
    proc = _logs(
        "log.debug('dropped-debug')\n"
        "print('logging' in sys.modules)\n"
        "log.warning('shown-warning')\n")
    assert proc.stdout.split() == ["False"], proc.stdout
    assert "shown-warning" in proc.stderr and "dropped" not in proc.stderr, proc.stderr


def test_a_kept_listing_imports_no_more_than_it_needs(tmp_path):
    """`list --json` printed from a kept listing imports neither logging nor the modules
    only a write or a mistake needs (tempfile, difflib, textwrap): each costs milliseconds
    of a command whose budget is a tenth of `import torch`."""
    code = (
        "import sys, io, contextlib\n"
        "from opregistry.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['list', '--json'])\n"
        "print(' '.join(m for m in ('logging', 'tempfile', 'difflib', 'textwrap', 'torch')\n"
        "               if m in sys.modules))\n")
    env = {**os.environ, "OPREGISTRY_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # the plan's cache entry; then the listing of the plan it holds
        warm = run("-c", code, env=env)
        assert warm.returncode == 0, warm.stderr
    proc = run("-c", code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [], proc.stdout
    assert (tmp_path / "cache").is_dir()


_ENDING = """
import atexit, sys, threading
class Teardown:
    def __del__(self):
        sys.stderr.write("torn down\\n")
kept = Teardown()  # freed by the interpreter's teardown, when there is one
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
if "thread" in sys.argv:  # alive until the teardown, however slow the start: the
    # teardown releases it (threading's exit hooks run before it waits for the thread)
    released = threading.Event()
    threading._register_atexit(released.set)
    threading.Thread(target=lambda: (released.wait(60), sys.stderr.write("thread done\\n"))).start()
if "torch" in sys.argv:
    sys.modules["torch"] = type(sys)("torch")
sys.argv = ["opregistry", sys.argv[1]]
from opregistry.cli import run
run()
"""


@pytest.mark.parametrize("case", ["plain", "thread", "torch"])
def test_the_command_ends_without_the_teardown_only_where_nothing_waits_for_it(case):
    """`opregistry` (cli.run) skips the interpreter's teardown when torch is not imported and no
    thread runs: the exit handlers still run, the output is whole, the status is main's."""
    for command, status in (("--version", 0), ("no-such-command", 2)):
        proc = run("-c", _ENDING, command, case)
        assert proc.returncode == status, proc.stderr
        assert "exit handler ran" in proc.stderr
        assert ("opregistry " in proc.stdout) == (status == 0)
        assert ("torn down" in proc.stderr) == (case != "plain"), proc.stderr
        assert ("thread done" in proc.stderr) == (case == "thread")


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_the_command_ends_quietly_when_its_reader_has_gone(unbuffered):
    """`opregistry --version | true`: the reader closed the pipe before the output was written
    (unbuffered) or flushed at the end: status 0, no traceback, no 'Exception ignored'."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "opregistry", "--version"], stdout=write,
                          stderr=subprocess.PIPE, text=True, env=env)
    os.close(write)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
