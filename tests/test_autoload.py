"""Ops at ``import torch``: torch's device-backend autoload entry point, in fresh processes.

Each test starts a new interpreter, because the entry point runs once, at
the end of ``import torch``.  The interpreter sees the repo's pip-installed
distributions (core, backends, tutorial-ops) and, where a test adds them,
temporary distributions on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import per_version
from .conftest import STRICT_IMPORT_PROBE

#: Imports torch only: no opregistry, no tutorial_ops in the user's code.
PROBE = """
import json, sys
import torch
ns = torch.ops.tutorial
result = {"muladd": hasattr(ns, "muladd"), "opregistry_imported": "opregistry" in sys.modules,
          "registry_imported": "opregistry.registry" in sys.modules}
if result["muladd"]:
    result["value"] = torch.ops.tutorial.muladd(torch.ones(2), torch.full((2,), 3.0), 1.0).tolist()
if "opregistry" in sys.modules:
    import opregistry
    reg = opregistry.get_registry()
    result["registry"] = reg is not None
    result["problems"] = [p.to_dict() for p in reg.problems] if reg else []
print(json.dumps(result))
"""


def _run(code: str, extra_path: Path | None = None, **env_vars: str) -> dict:
    return _run_full(code, extra_path, **env_vars)[0]


def _run_full(code: str, extra_path: Path | None = None, **env_vars: str) -> tuple[dict, str]:
    """Run ``code`` in a fresh interpreter; its last stdout line (JSON) and its stderr."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(env_vars)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path),
                                                         env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, f"import torch failed:\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_import_torch_alone_makes_installed_ops_callable():
    """`import torch` runs opregistry's torch.backends entry point: torch.ops.tutorial.muladd works."""
    result = _run(PROBE)
    assert result["muladd"] is True
    assert result["value"] == [4.0, 4.0]
    assert result["registry"] is True
    # none on torch >= 2.13; nnkit's tag `out` refused on older releases (tests/per_version.py)
    per_version.check_installed_errors(result["problems"])


@pytest.mark.parametrize("switch", [{"OPREGISTRY_AUTOLOAD": "0"},
                                    {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}],
                         ids=["OPREGISTRY_AUTOLOAD=0", "TORCH_DEVICE_BACKEND_AUTOLOAD=0"])
def test_autoload_switches_turn_it_off(switch):
    """Either switch leaves torch.ops without the installed ops and no registry loaded."""
    result = _run(PROBE, **switch)
    assert result["muladd"] is False
    assert result.get("registry", False) is False
    if "TORCH_DEVICE_BACKEND_AUTOLOAD" in switch:
        # torch does not even look at the entry point
        assert result["opregistry_imported"] is False
    else:  # the entry point reads the switch and stops: no pipeline is imported
        assert result["registry_imported"] is False


def test_ops_load_on_demand_when_autoload_is_off():
    """With autoload off, opregistry.load() (or an OpHandle call) still registers everything."""
    code = """
import json, torch, opregistry
before = hasattr(torch.ops.tutorial, "muladd")
reg = opregistry.load()
errors = sorted({(p.code, o.distribution) for p in reg.errors for o in p.culprits})
print(json.dumps([before, hasattr(torch.ops.tutorial, "muladd"), errors]))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env["OPREGISTRY_AUTOLOAD"] = "0"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [
        False, True, [list(e) for e in sorted(per_version.EXPECTED_ERRORS)]]


BROKEN = {
    # module raises at import
    "broken_import": "raise RuntimeError('broken_import: cannot start')\n",
    # exits at import, as a module that parses sys.argv at import does
    "broken_exit": "import sys\nsys.exit(2)\n",
    # a hook raises while declarations are collected
    "broken_hook": "def opregistry_ops():\n    raise ValueError('broken_hook: no ops today')\n",
    # declares fine, but its kernel module does not exist: fails while registering
    "broken_kernel": (
        "from opregistry import OpLibrary\n"
        "lib = OpLibrary('brokenkernelns')\n"
        "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'no_such_module_xyz:f'})\n"
    ),
    # a backend whose availability check raises
    "broken_backend": (
        "from opregistry import Backend\n"
        "def opregistry_backends():\n"
        "    return [Backend(name='npu', keys=('PrivateUse1',))]\n"
        "def opregistry_backend_available(backend):\n"
        "    raise OSError('broken_backend: driver exploded')\n"
        "def opregistry_materialize_kernel(library, kernel, fn):\n"
        "    return True\n"
    ),
}


def test_broken_plugins_do_not_break_import_torch(dists):
    """Plugins failing at import, in a hook, at registration: `import torch` works, problems kept."""
    for name, source in BROKEN.items():
        mod = f"{name}_plugin"
        group = {"backends": {name: mod}} if name == "broken_backend" else \
            {"ops": {name: f"{mod}:lib" if name == "broken_kernel" else mod}}
        dists.make(name.replace("_", "-"), modules={mod: source}, **group)
    result, stderr = _run_full(PROBE, extra_path=dists.root)
    # logged (logging's last-resort handler prints warnings to stderr) ...
    for dist in ("broken-import", "broken-exit", "broken-hook", "broken-kernel",
                 "broken-backend"):
        assert dist in stderr, stderr[-3000:]
    # ... and the healthy distributions still load
    assert result["muladd"] is True and result["value"] == [4.0, 4.0]
    assert result["registry"] is True
    blamed = {d for p in result["problems"] if p["severity"] == "error"
              for d in p["distributions"]}
    from importlib.metadata import version

    assert blamed == {"broken-import==1.0", "broken-exit==1.0", "broken-hook==1.0",
                      "broken-kernel==1.0", "broken-backend==1.0"} | {
        f"{d}=={version(d)}" for d in per_version.REFUSED_DISTRIBUTIONS}, result["problems"]
    messages = " ".join(p["message"] for p in result["problems"])
    for fragment in ("cannot start", "SystemExit: 2", "no ops today", "no_such_module_xyz", "driver exploded"):
        assert fragment in messages


def test_autoload_failure_inside_opregistry_is_logged_not_raised(monkeypatch):
    """Even an unexpected error in load() itself is logged; autoload() returns normally."""
    from structlog.testing import capture_logs

    from opregistry import autoload as autoload_module
    from opregistry import registry

    def explode(**kwargs):
        raise RuntimeError("resolver bug")

    monkeypatch.setattr(registry, "load", explode)
    with capture_logs() as logs:
        autoload_module.autoload()
    assert any("resolver bug" in str(entry.get("error")) for entry in logs), logs


# -- OPREGISTRY_STRICT at import torch: the same as load(strict=True) ----------------



def _healthy_and_broken(dists):
    dists.make("strict-ok", ops={"ops": "strict_ok_mod:lib"}, modules={
        "strict_ok_mod": "from opregistry import OpLibrary\nlib = OpLibrary('strictok')\n"
                         "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'strict_ok_mod:f'})\n"
                         "def f(x):\n    return x.clone()\n"})
    dists.make("strict-broken", ops={"ops": "strict_broken_mod"},
               modules={"strict_broken_mod": "import numpyy  # a typo\n"})


def test_strict_import_torch_fails_with_the_problems_and_registers_nothing(dists):
    """OPREGISTRY_STRICT=1: `import torch` fails, its cause the ResolutionError; nothing registered."""
    _healthy_and_broken(dists)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(OPREGISTRY_STRICT="1", PYTHONPATH=os.pathsep.join(
        filter(None, [str(dists.root), env.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", STRICT_IMPORT_PROBE, "strictok::f", "tutorial::muladd"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failed"] and result["cause"] == "ResolutionError", result
    assert "plugin-missing-module" in result["codes"]
    assert "strict-broken==1.0" in result["message"] and "nothing was registered" in result["message"]
    assert not any(result["present"].values()), "strict: nothing is registered"
    # the same environment without strict: import torch works and the rest loads
    del env["OPREGISTRY_STRICT"]
    out = subprocess.run([sys.executable, "-c", STRICT_IMPORT_PROBE, "strictok::f", "tutorial::muladd"], capture_output=True, text=True,
                         env=env, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["failed"] and all(result["present"].values()), result


def test_strict_import_torch_without_problems_loads(dists):
    """Strict with a clean environment: `import torch` works and every op is there."""
    # on torch < 2.13 nnkit is refused (tests/per_version.py): blocked, the rest is clean
    block = ",".join(sorted(per_version.REFUSED_DISTRIBUTIONS))
    result = _run(PROBE, OPREGISTRY_STRICT="1", **({"OPREGISTRY_BLOCK": block} if block else {}))
    assert result["muladd"] is True and result["registry"] is True
    assert not [p for p in result["problems"] if p["severity"] == "error"], result["problems"]


@pytest.mark.parametrize("variable", ["OPREGISTRY_STRICT", "OPREGISTRY_AUTOLOAD"])
def test_invalid_setting_at_import_torch_is_logged_and_registers_nothing(variable):
    """`import torch` never breaks on a bad value; it registers nothing and says why, once."""
    code = PROBE + """
import opregistry
try:
    opregistry.load()
except opregistry.ConfigError as exc:
    print(json.dumps({"load": str(exc)}))
"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env[variable] = "ture"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    *_, probe, loaded = out.stdout.strip().splitlines()
    assert json.loads(probe)["muladd"] is False, "an invalid configuration registers nothing"
    assert f"{variable}='ture' is not a boolean" in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert f"{variable}='ture' is not a boolean: use 1/0, true/false, yes/no or on/off" == \
        json.loads(loaded)["load"], "load() raises the same error"


def test_strict_import_torch_with_an_invalid_config_file_fails(tmp_path):
    """OPREGISTRY_STRICT=1 and an unreadable OPREGISTRY_CONFIG: `import torch` fails with the ConfigError."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(OPREGISTRY_STRICT="1", OPREGISTRY_CONFIG=str(tmp_path / "missing.toml"))
    out = subprocess.run([sys.executable, "-c", STRICT_IMPORT_PROBE, "strictok::f", "tutorial::muladd"], capture_output=True, text=True,
                         env=env, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failed"] and result["cause"] == "ConfigError", result
    assert "missing.toml: cannot read the file" in result["message"]
    assert not result["present"]["tutorial::muladd"]


#: atexit handlers around import torch: the one registered before it runs after opregistry's
#: (handlers run last-in, first-out), the one registered after it runs before
AT_EXIT = """
import atexit, json, sys
def before():
    import opregistry, torch
    sys.stdout.write(json.dumps({"before": {
        "registry": opregistry.get_registry() is not None,
        "defined": "tutorial::muladd" in torch._C._dispatch_get_all_op_names()}})
        + "\\n")
atexit.register(before)
import torch
def after():
    value = torch.ops.tutorial.muladd(torch.ones(2), torch.full((2,), 3.0), 1.0).tolist()
    sys.stdout.write(json.dumps({"after": value}) + "\\n")
atexit.register(after)
"""


def test_registrations_are_unregistered_at_exit_after_handlers_registered_later():
    """At exit opregistry unloads its registry before torch's own teardown: an atexit handler
    registered after ``import torch`` still calls the ops; one registered before sees them gone."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", AT_EXIT], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert lines == [{"after": [4.0, 4.0]}, {"before": {"registry": False, "defined": False}}], \
        out.stdout


#: counts torch's module-lock round trips (``import torch`` while torch is still being
#: imported) made while opregistry registers, optionally with another thread alive, and
#: reads torch's initializing mark right after opregistry's load
LOCK_PROBE = """
import importlib._bootstrap as bootstrap, json, sys, threading
other = len(sys.argv) > 1
if other:
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
calls = {"registering": 0}
original = bootstrap._lock_unlock_module
def spy(name):
    state = sys.modules.get("opregistry.state")
    if name == "torch" and state is not None and state.process().thread.registering:
        calls["registering"] += 1
    return original(name)
bootstrap._lock_unlock_module = spy
import opregistry.autoload as entry  # torch's entry point reads its `autoload` from here
load = entry.autoload
def autoload():
    load()
    calls["marked_after_load"] = sys.modules["torch"].__spec__._initializing
entry.autoload = autoload
import torch
bootstrap._lock_unlock_module = original
if other:
    stop.set()
import opregistry
calls["kernels"] = len(opregistry.get_registry().kernels)
calls["value"] = torch.ops.tutorial.muladd(torch.ones(2), torch.full((2,), 3.0), 1.0).tolist()
print(json.dumps(calls))
"""


@pytest.mark.parametrize("other_thread", [False, True], ids=["alone", "another-thread"])
def test_registering_inside_import_torch_skips_its_import_lock_when_alone(other_thread):
    """torch's registration calls import torch (from C++), which inside ``import torch`` takes
    its module lock each time: with no other thread alive, opregistry's registrations skip it
    (no thread can be waiting for torch); with one, the lock is kept, so that thread waits for
    a complete torch.  Either way the mark is back once the load is over, and the ops work."""
    args = ["-c", LOCK_PROBE] + (["other"] if other_thread else [])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    calls = json.loads(out.stdout.strip().splitlines()[-1])
    assert calls["kernels"] > 0 and calls["value"] == [4.0, 4.0]
    # the mark set back once opregistry's load is over: torch is still being imported
    assert calls["marked_after_load"] is True, calls
    if other_thread:
        assert calls["registering"] >= calls["kernels"] // 2, calls
    else:
        assert calls["registering"] == 0, calls
