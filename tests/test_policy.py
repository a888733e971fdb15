"""Override policy: no silent replacement of torch's or another distribution's kernels.

A kernel that replaces one registered by torch (``aten::add``) or by another
distribution needs ``override=True`` on its declaration *and* the user's
policy (``OPREGISTRY_ALLOW_OVERRIDE`` or the ``OPREGISTRY_CONFIG`` file).
Every override in effect is listed by ``opregistry list`` and ``doctor``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opregistry
from opregistry import ConfigError
from opregistry.cli import main
from opregistry.config import Settings

from .conftest import DistFactory, load, plan

ADD = "aten::add.Tensor"
SUB = "def sub(a, b, alpha=1):\n    return a.sub(b)\n"


def evil(dists: DistFactory, ns: str, *, override: bool = True) -> str:
    """A distribution replacing torch's CPU kernel of aten::add.Tensor with a subtraction."""
    module, kernels = f"evil_{ns}", f"evil_kernels_{ns}"
    return dists.make("evil", ops={"ops": f"{module}:lib"}, modules={
        module: "from opregistry import OpLibrary\n"
                "lib = OpLibrary('aten', 'IMPL')\n"
                f"lib.impl('add.Tensor', 'cpu', '{kernels}:sub', override={override})\n",
        kernels: SUB})


def scope(dists: DistFactory) -> list[str]:
    return ["opregistry-cpu", *dists.names]


def cpu_kernel_line() -> str:
    """The CPU line of torch's dispatch table for aten::add.Tensor: who is in effect."""
    [line] = [x for x in torch._C._dispatch_dump(ADD).splitlines() if x.startswith("CPU:")]
    return line


def adds_up() -> bool:
    return torch.equal(torch.ones(2) + torch.ones(2), torch.full((2,), 2.0))


def cli_json(args: list[str], dists: DistFactory, capsys: pytest.CaptureFixture[str],
             monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict]:
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(scope(dists)))
    rc = main([*args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_aten_add_refused_by_default(dists, ns, capsys, monkeypatch):
    """override=True alone is not enough: the user's policy must allow it."""
    evil(dists, ns)
    torch_kernel = cpu_kernel_line()
    reg = load(dists, plugins=scope(dists))
    [problem] = [p for p in reg.errors if p.code == "kernel-torch-op-denied"]
    assert problem.culprits[0].dist == "evil==1.0"
    assert problem.culprits[0].entry_point == "ops"
    assert "OPREGISTRY_ALLOW_OVERRIDE=aten" in problem.hint
    assert problem.source.endswith(f"evil_{ns}.py:3")
    assert cpu_kernel_line() == torch_kernel and adds_up()
    assert not reg.plan.external_kernels
    rc, report = cli_json(["doctor"], dists, capsys, monkeypatch)
    assert rc == 1 and "kernel-torch-op-denied" in {p["code"] for p in report["problems"]}


def test_aten_add_allowed_in_effect_listed_and_restored(dists, ns, capsys, monkeypatch):
    """Policy allows it: listed as overriding torch, really in torch, and undone by unload()."""
    evil(dists, ns)
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", ADD)
    before = torch._C._dispatch_dump(ADD)

    rc, listing = cli_json(["list"], dists, capsys, monkeypatch)
    assert rc == 0
    [entry] = listing["external_kernels"]
    assert (entry["op"], entry["key"], entry["status"]) == (ADD, "CPU", "active")
    assert entry["overrides"]["name"] == "torch"
    assert entry["distribution"] == {"name": "evil", "version": "1.0"}
    rc, report = cli_json(["doctor"], dists, capsys, monkeypatch)
    [warning] = [p for p in report["problems"] if p["code"] == "kernel-overrides"]
    assert warning["op"] == ADD
    assert [(d["name"], d["version"]) for d in warning["distributions"]] == [("evil", "1.0")]

    reg = load(dists, plugins=scope(dists))
    try:
        assert not reg.errors
        [kernel] = reg.kernels
        assert kernel.overrides == "torch" and kernel.status == "active"
        in_effect = cpu_kernel_line()
        result = torch.ones(2) + torch.ones(2)
    finally:
        reg.unload()
    assert "RegisterCPU" not in in_effect, f"torch's kernel still in effect: {in_effect}"
    assert torch.equal(result, torch.zeros(2)), "the plugin's kernel ran"
    assert torch._C._dispatch_dump(ADD) == before, "unload restored torch's kernel"
    assert adds_up()


def test_policy_without_override_flag_is_refused(dists, ns, monkeypatch):
    """The declaration must say it overrides; a policy alone does not make it intended."""
    evil(dists, ns, override=False)
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", "aten")
    reg = load(dists, plugins=scope(dists))
    [problem] = [p for p in reg.errors if p.code == "kernel-override-undeclared"]
    assert problem.culprits[0].dist == "evil==1.0"
    assert adds_up()


def test_override_of_another_distribution_is_listed(dists, ns, capsys, monkeypatch):
    """An allowed override of a plugin's kernel shows who replaced whom."""
    kmod = f"k_{ns}"
    kernels = "def clone(x):\n    return x.clone()\n\ndef twice(x):\n    return x * 2\n"
    dists.make("owner", ops={"ops": f"owner_{ns}:lib"}, modules={
        f"owner_{ns}": f"from opregistry import OpLibrary\nlib = OpLibrary({ns!r})\n"
                       f"lib.define('foo(Tensor x) -> Tensor', kernels={{'cpu': '{kmod}:clone'}})\n",
        kmod: kernels})
    dists.make("patch", ops={"ops": f"patch_{ns}:lib"}, modules={
        f"patch_{ns}": f"from opregistry import OpLibrary\nlib = OpLibrary({ns!r}, 'IMPL')\n"
                       f"lib.impl('foo', 'cpu', '{kmod}:twice', override=True)\n"})
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", f"{ns}::foo")
    rc, listing = cli_json(["list"], dists, capsys, monkeypatch)
    assert rc == 0
    [op] = listing["ops"]
    by_status = {k["status"]: k for k in op["kernels"]}
    assert by_status["active"]["distribution"] == {"name": "patch", "version": "1.0"}
    assert by_status["active"]["overrides"] == {"name": "owner", "version": "1.0"}
    assert by_status["overridden"]["distribution"] == {"name": "owner", "version": "1.0"}
    reg = load(dists, plugins=scope(dists))
    assert torch.equal(getattr(torch.ops, ns).foo(torch.ones(2)), torch.full((2,), 2.0))
    reg.unload()
    assert f"{ns}::foo" not in torch._C._dispatch_get_all_op_names()


# -- the configuration file -----------------------------------------------------


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "opregistry.toml"
    path.write_text(text)
    return path


def test_config_file_allows_override(dists, ns, tmp_path, monkeypatch):
    evil(dists, ns)
    config = write_config(tmp_path, f'allow_override = ["{ADD}"]\n')
    monkeypatch.setenv("OPREGISTRY_CONFIG", str(config))
    resolved = plan(dists, plugins=scope(dists))
    [kernel] = resolved.external_kernels
    assert kernel.status == "active" and kernel.overrides == "torch"


def test_environment_overrides_config_file(dists, ns, tmp_path, monkeypatch):
    """As pip does: a variable set for one run beats the file."""
    evil(dists, ns)
    config = write_config(tmp_path, f'allow_override = ["{ADD}"]\nstrict = true\n')
    monkeypatch.setenv("OPREGISTRY_CONFIG", str(config))
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", "")
    monkeypatch.setenv("OPREGISTRY_STRICT", "0")
    reg = load(dists, plugins=scope(dists))
    assert [p.code for p in reg.errors] == ["kernel-torch-op-denied"]
    assert adds_up()


def test_config_file_block_and_strict(dists, ns, tmp_path, monkeypatch):
    evil(dists, ns)
    monkeypatch.setenv("OPREGISTRY_CONFIG", str(write_config(tmp_path, "strict = true\n")))
    with pytest.raises(opregistry.ResolutionError, match="kernel-torch-op-denied"):
        load(dists, plugins=scope(dists))
    monkeypatch.setenv("OPREGISTRY_CONFIG",
                       str(write_config(tmp_path, 'strict = true\nblock = ["Evil"]\n')))
    reg = load(dists, plugins=scope(dists))
    assert not reg.errors
    [reason] = [s.reason for s in reg.plan.skipped if s.origin.distribution == "evil"]
    assert reason.startswith("blocked by OPREGISTRY_CONFIG=") and "(key 'block')" in reason


@pytest.mark.parametrize(("text", "message"), [
    ("allow_overide = ['aten']\n", "unknown key 'allow_overide'; did you mean 'allow_override'"),
    ("plugins = 'mylib'\n", "plugins must be a list of strings"),
    ("strict = 1\n", "strict must be true or false"),
    ("strict = \n", "not valid TOML"),
])
def test_bad_config_file(tmp_path, text, message):
    config = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        Settings.from_env({"OPREGISTRY_CONFIG": str(config)})
    assert str(config) in str(info.value), "the message names the file"


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        Settings.from_env({"OPREGISTRY_CONFIG": str(tmp_path / "nope.toml")})


def test_listed_as_overriding_torch_without_torch() -> None:
    """``opregistry list`` resolves without torch: an allowed aten override still says so."""
    from opregistry.model import Declarations
    from opregistry.model import Kernel, Origin
    from opregistry.resolver import resolve

    where = Origin(distribution="evil", version="1.0", group="opregistry.ops", entry_point="ops",
                   value="evil:lib")
    kernel = Kernel(op=ADD, key="cpu", fn="evil_kernels:sub", override=True, origin=where)
    decl = Declarations(kernels=[kernel], distributions=[where])
    allowed = resolve(decl, policy=opregistry.Policy(allow_override={"aten::add"}))
    [entry] = allowed.external_kernels
    assert entry.overrides == "torch" and entry.to_dict()["overrides"] == "torch"
    denied = resolve(decl)
    assert [p.code for p in denied.errors] == ["kernel-torch-op-denied"]
    assert not denied.external_kernels


def test_config_file_allow_list(tmp_path, monkeypatch):
    """``plugins`` in the file is the allow-list; OPREGISTRY_PLUGINS (even empty) wins."""
    config = write_config(tmp_path, 'plugins = ["My_Lib", "opregistry-cpu"]\n')
    settings = Settings.from_env({"OPREGISTRY_CONFIG": str(config)})
    assert settings.allow == {"my-lib", "opregistry-cpu"}
    assert settings.admits("evil") == f"not in OPREGISTRY_CONFIG={config} (key 'plugins')"
    assert settings.admits("my-lib") is None
    env = {"OPREGISTRY_CONFIG": str(config), "OPREGISTRY_PLUGINS": ""}
    assert Settings.from_env(env).allow == frozenset()
