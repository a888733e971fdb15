"""Third-party code contained everywhere it runs, and every unplanned change to torch caught.

The per-plugin fault cases are in tests/test_fault_matrix.py; these are the
ones that need a subprocess (``import torch``, a real Ctrl-C), the CLI, torch's
own refusals, or the registry after load.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import opregistry
from opregistry import torch_state
from opregistry.errors import SchemaError
from opregistry.schema import MAX_ARGUMENTS, parse_signature

from . import per_version
from .conftest import BACKENDS, DistFactory, load, op_dist


def run_python(code: str, dists: DistFactory, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that sees ``dists`` (and only them, plus the backends)."""
    environ = {**os.environ, "PYTHONPATH": str(dists.root),
               "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, *dists.names]), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environ, timeout=300)


def ok_dist(dists: DistFactory, ns: str) -> str:
    return op_dist(dists, "fine", f"{ns}ok",
                   "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'})\n")


def test_kernel_module_exiting_does_not_end_import_torch(dists: DistFactory, ns: str) -> None:
    """sys.exit(3) in a kernel module: import torch goes on, the others' ops work, it is reported."""
    ok_dist(dists, ns)
    op_dist(dists, "exits", ns, "lib.define('g(Tensor x) -> Tensor', kernels={'cpu': 'exits_mod:k'})\n")
    (dists.root / "exits_mod.py").write_text("import sys\nsys.exit(3)\n")
    proc = run_python(f"""
        import torch, opregistry
        print(torch.ops.{ns}ok.f(torch.ones(2)).tolist())
        print([p.code for p in opregistry.get_registry().errors])
        print(hasattr(torch.ops.{ns}, "g"))
    """, dists)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[1.0, 1.0]"
    assert "materialize-failed" in lines[1] and lines[2] == "False"


def test_custom_base_exception_fails_one_distribution_not_the_registry(dists: DistFactory,
                                                                         ns: str) -> None:
    """A BaseException subclass from a kernel module costs its distribution only."""
    ok_dist(dists, ns)
    op_dist(dists, "boom", ns, "lib.define('g(Tensor x) -> Tensor', kernels={'cpu': 'boom_mod:k'})\n")
    (dists.root / "boom_mod.py").write_text("class Boom(BaseException):\n    pass\nraise Boom()\n")
    proc = run_python(f"""
        import torch, opregistry
        print(torch.ops.{ns}ok.f(torch.ones(1)).tolist())
    """, dists)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1.0]"
    assert "autoload failed" not in proc.stderr


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "type('Custom', (BaseException,), {})"])
def test_doctor_reports_base_exceptions_of_declaration_modules(dists: DistFactory, ns: str,
                                                                raised: str) -> None:
    """doctor never ends in a traceback because of a plugin: the problem is reported, exit 1."""
    op_dist(dists, "rude", ns, f"raise {raised}()\n")
    proc = run_python("import sys; from opregistry.cli import main; sys.exit(main(['doctor']))",
                      dists)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "plugin-import-error" in proc.stdout and "rude==1.0" in proc.stdout


def test_a_real_ctrl_c_still_stops_the_process(dists: DistFactory, ns: str) -> None:
    """SIGINT while a plugin is imported is the user's: the process stops (not contained)."""
    op_dist(dists, "slow", ns, textwrap.dedent("""
        import os, signal, time
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        """))
    proc = run_python("""
        import opregistry
        opregistry.plan()
        print("went on")
    """, dists)
    assert "went on" not in proc.stdout
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr


def test_plan_restores_the_sigint_handler() -> None:
    """The interrupt watcher puts back the handler it found."""
    before = signal.getsignal(signal.SIGINT)
    opregistry.plan(plugins=[])
    assert signal.getsignal(signal.SIGINT) is before


def _needs_registration_sites() -> None:
    if not per_version.records_registration_sites():
        pytest.skip(f"needs a torch that records which file registered a Python kernel (2.9 and "
                    f"later do; {per_version.TORCH} does not): a replacement cannot be attributed "
                    f"here; that nothing is reported falsely is checked")


def test_drift_reports_a_kernel_replaced_after_load(dists: DistFactory, ns: str) -> None:
    """Replacing a planned kernel with Library.impl after load is reported per op and key."""
    op_dist(dists, "owner", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'},"
                                " fake='KMOD:fake')\n")
    registry = load(dists)
    assert registry.drift() == ()
    _needs_registration_sites()
    intruder = torch.library.Library(ns, "IMPL")
    try:
        intruder.impl("f", lambda x: x * 0, "CPU", allow_override=True)
        [problem] = registry.drift()
        assert (problem.code, problem.op, problem.key) == ("kernel-replaced", f"{ns}::f", "CPU")
        assert "owner==1.0" in problem.message and __file__ in (problem.source or "")
    finally:
        intruder._destroy()
    assert registry.drift() == ()


def test_hook_returning_a_record_subclass_is_refused(dists: DistFactory, ns: str) -> None:
    """A subclass of a record could run its own code inside the resolver: refused."""
    module = f"sub_{ns}"
    dists.make("subclasser", ops={"ops": module}, modules={module: textwrap.dedent(f"""
        from opregistry import Namespace
        class Sneaky(Namespace):
            pass
        def opregistry_namespaces():
            return [Sneaky(name={ns!r})]
        """)})
    [problem] = [p for p in opregistry.plan(plugins=dists.names).errors]
    assert problem.code == "plugin-invalid" and "Sneaky" in problem.message


# -- the resolver refuses what torch refuses ------------------------------------------

REFUSED_BY_TORCH = [
    "(float x=inf) -> Tensor",
    "(float x=-inf) -> Tensor",
    "(float x=nan) -> Tensor",
    "(Scalar x=inf) -> Tensor",
    "(int x=+3) -> Tensor",
    "(float x=+1.5) -> Tensor",
    "(int x=9223372036854775808) -> Tensor",
    "(int x=-9223372036854775809) -> Tensor",
    "(float x=1e400) -> Tensor",
    "(" + ", ".join(f"Tensor x{i}" for i in range(MAX_ARGUMENTS + 1)) + ") -> Tensor",
]
ACCEPTED_BY_TORCH = [
    "(int x=-9223372036854775808) -> Tensor",
    "(int x=9223372036854775807) -> Tensor",
    "(float x=1e300) -> Tensor",
    "(float x=-1.5) -> Tensor",
    "(" + ", ".join(f"Tensor x{i}" for i in range(MAX_ARGUMENTS)) + ") -> Tensor",
    "(Tensor " + "x" * 300 + ") -> Tensor",
]


@pytest.mark.parametrize("signature", REFUSED_BY_TORCH, ids=lambda s: s[:30])
def test_resolver_refuses_what_torch_refuses(signature: str, ns: str) -> None:
    """Each of these is refused by torch's Library.define, and by the resolver first."""
    lib = torch.library.Library(ns, "DEF")
    try:
        with pytest.raises(Exception):
            lib.define(f"probe{signature}")
    finally:
        lib._destroy()
    with pytest.raises(SchemaError):
        parse_signature(signature)


@pytest.mark.parametrize("signature", ACCEPTED_BY_TORCH, ids=lambda s: s[:30])
def test_resolver_accepts_what_torch_accepts_at_the_edges(signature: str, ns: str) -> None:
    """The limits are torch's, not tighter: these define in torch and pass the resolver."""
    parse_signature(signature)
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define(f"probe{signature}")
    finally:
        lib._destroy()


# -- canaries: the torch internals the watch relies on --------------------------------


def test_library_init_reads_its_callers_frame_and_makes_a_dispatch_library() -> None:
    """guard's watch wraps torch._C._dispatch_library and reads Library.__init__'s ``self``."""
    source = inspect.getsource(torch.library.Library.__init__)
    # the file:line torch records: its caller's frame (2.13), a stack entry (2.8-2.12)
    assert "torch._C._dispatch_library(" in source
    assert "sys._getframe(1)" in source or "traceback.extract_stack(" in source
    assert list(inspect.signature(torch.library.Library.__init__).parameters)[:3] == [
        "self", "ns", "kind"]
    assert callable(torch._C._dispatch_library)


def test_watch_records_libraries_with_their_creator(ns: str) -> None:
    """A Library made inside the watch is recorded with this file's line; undoing restores."""
    with torch_state.watch_registrations() as watch:
        lib = torch.library.Library("aten", "IMPL"); line = inspect.currentframe().f_lineno  # noqa: E702
        lib.impl("mul.Tensor", lambda a, b: a.add(b), "CPU")
    [(handle, namespace, kind, where)] = watch.created
    assert (handle, namespace, kind, where) == (lib.m, "aten", "IMPL", f"{__file__}:{line}")
    [event] = watch.events
    assert (event.op, event.slot, event.library, event.handle) == (
        "aten::mul.Tensor", "CPU", lib, lib.m) and watch.made(event)
    assert event.site == f"{__file__}:{line + 1}"
    registered_at = torch_state.kernel_registrations("aten::mul.Tensor")["CPU"]
    if per_version.records_registration_sites():
        assert registered_at == f"{__file__}:{line}", "torch records the real creator, not the watch"
    else:  # torch 2.8: no file for a Python registration
        assert registered_at.startswith("/dev/null:") and not torch_state.site_recorded(registered_at)
    torch_state.undo_library(handle, [event.library])
    a = torch.arange(3.0)
    assert torch.equal(torch.mul(a, a), torch.tensor([0.0, 1.0, 4.0]))
    # the recorder stays installed; the wrappers keep torch's names
    assert torch.library.Library.impl.__name__ == "impl"


def test_watch_sees_only_its_own_thread(ns: str) -> None:
    """A registration another thread makes meanwhile is not the watched code's."""
    import threading

    made = threading.Event()

    def elsewhere() -> None:
        other = torch.library.Library(ns, "DEF")
        other.define("g(Tensor x) -> Tensor")
        made.set()
        torch_state.destroy_library(other)

    with torch_state.watch_registrations() as watch:
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        mine = torch.library.Library(f"{ns}b", "DEF")
        mine.define("f(Tensor x) -> Tensor")
    assert made.is_set()
    assert [(n, k) for _, n, k, _ in watch.created] == [(f"{ns}b", "DEF")]
    assert [e.op for e in watch.events] == [f"{ns}b::f"]
    torch_state.destroy_library(mine)


def test_a_bare_def_is_undone_by_its_handle(ns: str) -> None:
    """A Library that only claims a namespace is known by its C++ handle, and undone by it."""
    with torch_state.watch_registrations() as watch:
        claim = torch.library.Library(ns, "DEF")
    [(handle, namespace, kind, _)] = watch.created
    assert (handle, namespace, kind, watch.events) == (claim.m, ns, "DEF", [])
    torch_state.undo_library(handle)
    again = torch.library.Library(ns, "DEF")  # the namespace is free again
    torch_state.destroy_library(again)


def test_installed_registry_has_no_drift(installed: opregistry.Registry) -> None:
    """What import torch registered is what torch dispatches to (nothing shadowed on this torch)."""
    assert installed.op_names, "the example packages are installed"
    assert installed.drift() == ()


def test_check_contains_a_sample_function_that_exits(dists: DistFactory, ns: str) -> None:
    """`opregistry check` reports a sample function calling sys.exit as a failure, and goes on."""
    from opregistry.checking import run_checks

    samples = f"samples_{ns}"
    (dists.root / f"{samples}.py").write_text("import sys\ndef bad():\n    sys.exit(4)\n")
    op_dist(dists, "exiting-samples", ns,
            f"lib.define('f(Tensor x) -> Tensor', kernels={{'cpu': 'KMOD:clone'}}, "
            f"fake='KMOD:fake', samples='{samples}:bad')\n")
    results, unknown = run_checks(load(dists), [ns])
    assert not unknown
    [result] = results
    assert (result.check, result.status) == ("samples", "fail")
    assert "SystemExit" in result.message


def test_missing_module_points_at_no_line_of_opregistry(dists: DistFactory) -> None:
    """A missing module has no line of the user's to point at: never one of opregistry's own."""
    dists.make("ghost", ops={"ops": "no_such_module_anywhere:lib"})
    [problem] = opregistry.plan(plugins=dists.names).errors
    assert problem.code == "plugin-missing-module"
    assert problem.source is None or "/opregistry/" not in problem.source


DECORATOR_STYLE = """
import torch
from opregistry import OpLibrary

lib = OpLibrary(NS)


@lib.op(mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2
"""


def test_decorator_package_imported_before_torch_works(dists: DistFactory, ns: str) -> None:
    """Importing a decorator-style package first (it imports torch) defers it, then completes it."""
    ok_dist(dists, ns)
    _, module = dists.module_dist("decorated", ns, DECORATOR_STYLE)
    proc = run_python(f"""
        from {module} import double
        import torch, opregistry
        print(torch.ops.{ns}ok.f(torch.ones(1)).tolist())   # the others loaded at import torch
        print(double(torch.ones(2)).tolist())               # completed at its first call
        print(torch.ops.{ns}.double(torch.ones(1)).tolist())
        print([p.code for p in opregistry.get_registry().errors])
    """, dists)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[1.0]", "[2.0, 2.0]", "[2.0]", "[]"]


def test_list_with_a_decorator_package_prints_no_false_error(dists: DistFactory, ns: str) -> None:
    """`opregistry list` imports the package, which imports torch: no autoload error is printed."""
    dists.module_dist("decorated", ns, DECORATOR_STYLE)
    proc = run_python("import sys; from opregistry.cli import main; sys.exit(main(['list']))",
                      dists)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "autoload failed" not in proc.stderr and "error" not in proc.stderr.lower()
    assert f"{ns}::double" in proc.stdout


def test_doctor_live_reports_a_replaced_kernel(dists: DistFactory, ns: str, scoped,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`opregistry doctor --live` lists the drift of the loaded registry, and exits 1."""
    import json

    from opregistry.cli import main

    op_dist(dists, "owner", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'},"
                                " fake='KMOD:fake')\n")
    scoped()
    load(dists)
    if not per_version.records_registration_sites():
        assert main(["doctor", "--live", "--json"]) == 0, "no false report"
    _needs_registration_sites()
    intruder = torch.library.Library(ns, "IMPL")
    try:
        intruder.impl("f", lambda x: x * 0, "CPU", allow_override=True)
        assert main(["doctor", "--live", "--json"]) == 1
        found = [p for p in json.loads(capsys.readouterr().out)["problems"]
                 if p["code"] == "kernel-replaced"]
        assert [(p["op"], p["key"]) for p in found] == [(f"{ns}::f", "CPU")]
    finally:
        intruder._destroy()
    assert main(["doctor", "--live", "--json"]) == 0


# -- doctor (no torch) and import torch: one verdict -------------------------------------

#: a fresh interpreter's verdict: the distributions left out, by plain `opregistry doctor`
#: (which must not import torch itself) or by `import torch` (autoload)
VERDICT_OF = {
    "doctor": """
import contextlib, io, json, sys
from opregistry.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["doctor", "--json"])
report = json.loads(out.getvalue())
print(json.dumps(sorted({d["name"] for p in report["problems"] if p["severity"] == "error"
                         for d in p["distributions"]})))
""",
    "import torch": """
import json, torch, opregistry
registry = opregistry.get_registry()
print(json.dumps(sorted({o.distribution for p in registry.errors for o in p.culprits})))
""",
}


def verdicts(dists: DistFactory, *paths: str, **env: str) -> dict[str, list[str]]:
    import json

    found = {}
    for how, code in VERDICT_OF.items():
        proc = run_python(code, dists, PYTHONPATH=os.pathsep.join(paths or (str(dists.root),)),
                          **env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[how] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("raw_first", [True, False])
def test_a_raw_def_beside_a_declarer_gets_one_verdict(dists: DistFactory, ns: str, tmp_path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      raw_first: bool) -> None:
    """A plugin that imports torch and makes Library(ns, "DEF") at its import, another that
    declares ns: undone and left out, the declarer kept, by doctor without torch as by
    import torch, whichever is discovered first."""
    from .conftest import DistFactory as Factory

    other = Factory(tmp_path / "raw", monkeypatch)
    other.root.mkdir()
    raw = other.make("rawdef", ops={"ops": f"rawdef_{ns}:lib"}, modules={f"rawdef_{ns}": (
        "import torch\n"
        f"_mine = torch.library.Library({ns!r}, 'DEF')\n"
        "_mine.define('held(Tensor x) -> Tensor')\n"
        "from opregistry import OpLibrary\n"
        f"lib = OpLibrary('{ns}raw')\n")})
    dists.names.append(raw)
    op_dist(dists, "declarer", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'})\n")
    paths = [str(other.root), str(dists.root)]
    found = verdicts(dists, *(paths if raw_first else paths[::-1]))
    assert found == {"doctor": [raw], "import torch": [raw]}, found
