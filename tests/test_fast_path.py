"""The ops the benchmarks time keep every guarantee on opregistry's fast paths.

``benchmarks/benchops.py`` defines the two benchmark ops (1 and 12
arguments); here they are installed as a real distribution with CPU, fake,
autograd and vmap kernels, and checked with opcheck (all four utils),
gradcheck / gradgradcheck, torch.compile(fullgraph=True), torch.export,
vmap, FakeTensor and dispatch modes — the paths the lean Autograd kernel
must not short-circuit.  No timing here: see benchmarks/.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from opregistry import torch_state
from opregistry.schema import parse_signature

from .conftest import DistFactory, load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import benchops  # noqa: E402

benchops.ensure_importable()

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_dynamic")


@pytest.fixture
def bench(dists: DistFactory, ns: str) -> Iterator[Any]:
    """The benchmark's two ops, declared with CPU + fake + autograd + vmap, loaded."""
    module = f"{ns}_decl"
    dists.make(f"bench-{ns}", ops={ns: f"{module}:lib"},
               modules={module: benchops.registry_source(ns, full=True)})
    registry = load(dists, strict=True)
    assert {f"{ns}::one", f"{ns}::twelve"} <= set(registry.op_names)
    yield getattr(torch.ops, ns)


def _double(name: str, grad: bool) -> tuple[Any, ...]:
    return benchops.inputs(name, grad=grad, dtype=torch.double)


@pytest.mark.parametrize("name", ["one", "twelve", "three"])
@pytest.mark.parametrize("grad", [False, True])
def test_opcheck_all_four_utils(bench: Any, name: str, grad: bool) -> None:
    """opcheck passes every util, with and without grad-requiring inputs."""
    op = getattr(bench, name).default
    result = torch.library.opcheck(op, _double(name, grad), test_utils=OPCHECK_UTILS)
    assert result == {util: "SUCCESS" for util in OPCHECK_UTILS}


@pytest.mark.parametrize("name", ["one", "twelve", "three"])
def test_no_grad_path_matches_the_kernel(bench: Any, name: str) -> None:
    """Grad mode on, nothing requires grad: the result is the kernel's, untracked."""
    op = getattr(bench, name).default
    args = benchops.inputs(name)
    out = op(*args)
    torch.testing.assert_close(out, benchops.PARTS[name]["cpu"](*args))
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        grad_args = benchops.inputs(name, grad=True)
        out = op(*grad_args)
    assert not out.requires_grad


@pytest.mark.parametrize("name", ["one", "twelve", "three"])
def test_inference_mode(bench: Any, name: str) -> None:
    """inference_mode skips Autograd and still runs the CPU kernel."""
    op = getattr(bench, name).default
    with torch.inference_mode():
        args = benchops.inputs(name)
        out = op(*args)
        assert out.is_inference()
    torch.testing.assert_close(out, benchops.PARTS[name]["cpu"](*args))


def test_grad_path_gradcheck_and_gradgradcheck(bench: Any) -> None:
    """backward is differentiable for both ops: first and second order gradients check."""
    x = torch.randn(5, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(bench.one, (x,))
    assert torch.autograd.gradgradcheck(bench.one, (x,))
    x, y, *rest = _double("twelve", True)

    def twelve(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return bench.twelve(x, y, *rest)

    assert torch.autograd.gradcheck(twelve, (x, y))
    assert torch.autograd.gradgradcheck(twelve, (x, y))


def test_setup_context_sees_defaulted_arguments(bench: Any) -> None:
    """The dispatcher drops ``alpha=1.0``; setup_context still gets all 12 inputs."""
    x, y, *rest = benchops.inputs("twelve", grad=True)
    out = bench.twelve(x, y, *rest[:-1])  # alpha left at its default
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    torch.testing.assert_close(y.grad, torch.full_like(y, rest[3]))  # c = 0.5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["one", "twelve", "three"])
def test_compile_fullgraph(bench: Any, name: str) -> None:
    """torch.compile(fullgraph=True) forward and backward equal eager."""
    op = getattr(bench, name)
    if name == "three":  # its OpOverload, on torch's PyObject dispatch where torch has it
        op = op.default
        op(*benchops.inputs(name))  # the first eager call switches it
    compiled = torch.compile(lambda *a: op(*a) * 2, fullgraph=True, backend="aot_eager")
    args = benchops.inputs(name, grad=True)
    out = compiled(*args)
    out.sum().backward()
    expected_grad = args[0].grad.clone()
    args[0].grad = None
    (op(*args) * 2).sum().backward()
    torch.testing.assert_close(out, op(*args) * 2)
    torch.testing.assert_close(expected_grad, args[0].grad)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["one", "twelve", "three"])
def test_export(bench: Any, name: str) -> None:
    """torch.export keeps the op as one node and the exported program runs."""
    op = getattr(bench, name)
    rest = benchops.inputs(name)[2:] if name == "twelve" else ()

    class M(torch.nn.Module):
        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return op(*tensors, *rest) + 1

    tensors = benchops.inputs(name)[:{"one": 1, "twelve": 2, "three": 3}[name]]
    exported = torch.export.export(M(), tensors)
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert getattr(op, "default") in targets
    torch.testing.assert_close(exported.module()(*tensors), M()(*tensors))


def test_fake_tensor_mode_takes_the_redispatch_path(bench: Any) -> None:
    """Under FakeTensorMode the fake kernel runs (no direct call to the CPU kernel)."""
    with FakeTensorMode():
        x = torch.empty(4, 3)
        out = bench.one(x)
    assert isinstance(out, FakeTensor) and out.shape == (4, 3)


def test_dispatch_mode_sees_the_op(bench: Any) -> None:
    """A TorchDispatchMode sees the custom op itself, not only what its kernel calls."""
    seen: list[Any] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(3)
    bench.one(x)  # warm the keyset cache for plain CPU tensors first
    with Record():
        out = bench.one(x)
    assert bench.one.default in seen
    torch.testing.assert_close(out, x)


def test_conjugate_view_is_resolved_first(bench: Any) -> None:
    """A conj view has a Conjugate key before CPU: the kernel must get it resolved."""
    x = torch.randn(4, dtype=torch.complex64)
    bench.one(x)
    out = bench.one(x.conj())
    torch.testing.assert_close(out, x.conj())
    assert not out.is_conj()


@pytest.mark.parametrize("name", ["one", "twelve", "three"])
def test_vmap(bench: Any, name: str) -> None:
    """The vmap rule runs under torch.vmap (FuncTorchBatched is above Autograd)."""
    op = getattr(bench, name)
    if name == "one":
        xs = torch.randn(3, 8)
        torch.testing.assert_close(torch.vmap(op)(xs), xs)
    elif name == "three":
        xs, ws, b = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
        out = torch.vmap(lambda x, w: op(x, w, b))(xs, ws)
        torch.testing.assert_close(out, torch.relu(xs * ws + b))
    else:
        rest = benchops.inputs(name)[2:]
        xs, ys = torch.randn(3, 8), torch.randn(3, 8)
        out = torch.vmap(lambda x, y: op(x, y, *rest))(xs, ys)
        torch.testing.assert_close(out, xs + rest[3] * ys)


def test_unloaded_kernels_are_not_called(bench: Any, dists: DistFactory, ns: str) -> None:
    """After unload the device-kernel table no longer holds the destroyed kernels: forgotten
    by the unload itself (nothing may ask again: three objects a kernel, kept to the end of
    the process, which its finalization's collections would visit)."""
    from opregistry.backend import device_kernel
    from opregistry.state import process

    bench.one(torch.randn(2))
    assert device_kernel(f"{ns}::one", "CPU") is not None
    import opregistry

    opregistry.get_registry().unload()
    assert not [k for k in process().device_kernels if k[0].startswith(f"{ns}::")]
    assert device_kernel(f"{ns}::one", "CPU") is None


# -------------------------------------------------------------------------
# the benchmark scripts themselves run (tiny sizes; no timing is asserted)
# -------------------------------------------------------------------------

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str, *args: str, tmp_path: Path) -> dict[str, Any]:
    import json
    import subprocess

    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, str(BENCH / name), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_bench_call_measures_every_case(tmp_path: Path) -> None:
    """Every (op, mode, style) of the issue is measured and every target is reported."""
    sys.path.insert(0, str(BENCH))
    import bench_call

    data = _script("bench_call.py", "--reps", "1", "--number", "20", tmp_path=tmp_path)
    expected = {f"{op} | {mode} | {style}" for op in bench_call.OPS
                for mode in bench_call.MODES for style in bench_call.styles_for(mode)}
    assert set(data["us"]) == expected
    assert all(v > 0 for v in data["us"].values())
    assert len(data["targets"]) == len(bench_call.OPS) * len(bench_call.TARGETS)
    # opregistry's full ops took torch's PyObject dispatch exactly where torch has it
    assert bool(data["pyobj_dispatch"]) == torch_state.fast_dispatch_available()


@pytest.mark.slow
def test_bench_register_and_startup_run(tmp_path: Path) -> None:
    """Registration and start-up benchmarks run end to end on a tiny generated set."""
    reg = _script("bench_register.py", "--dists", "2", "--ops-per-dist", "3", "--reps", "1",
                  tmp_path=tmp_path)
    assert reg["ops"] == 6 and set(reg["seconds"]) == {
        "torch.library", "custom_op", "opregistry materialize", "opregistry load"}
    start = _script("bench_startup.py", "--dists", "2", "--ops-per-dist", "3", "--reps", "1",
                    tmp_path=tmp_path)
    assert start["ops"] == 6 and "opregistry list --json" in start["seconds"]
    phases = _script("startup_phases.py", "--dists", "2", "--ops-per-dist", "3", "--reps", "1",
                     tmp_path=tmp_path)
    assert phases["ops"] == 6 and len(phases["seconds"]) == 4
    for parts in phases["seconds"].values():
        assert 0 < parts["import torch"] < parts["wall"] and 0 < parts["finalization"] < parts["wall"]
        assert parts["full collection"] > 0 and parts["objects"] > 10_000  # torch's own heap
        assert 0 <= parts["gc in import"] < parts["import torch"]
    seconds = phases["seconds"]  # the ops keep objects: the floor's and opregistry's
    assert seconds["import torch + N ops"]["objects"] > seconds["bare import torch"]["objects"]
    stages = _script("warm_stages.py", "--dists", "2", "--ops-per-dist", "3", "--reps", "1",
                     tmp_path=tmp_path)
    assert stages["ops"] == 6 and set(stages["seconds"]) == {"real", "noop"}
    for parts in stages["seconds"].values():  # a warm load replays the entry's program
        assert 0 < parts["lookup"] + parts["program"] + parts["replay"] < parts["load"]
        assert parts["executor"] == parts["steps"] == 0


@pytest.mark.slow
def test_import_pairs_times_both_sides_in_process_and_whole(tmp_path: Path) -> None:
    """import_pairs.py: per pair, each side's import torch in process and its whole process."""
    data = _script("import_pairs.py", "--dists", "2", "--ops-per-dist", "3", "--reps", "2",
                   tmp_path=tmp_path)
    assert set(data["seconds"]) == {"opregistry", "floor"}
    for samples in data["seconds"].values():
        assert len(samples) == 2
        for in_process, whole in samples:  # the process also starts and exits
            assert 0 < in_process < whole
    for clock in ("in process", "whole"):
        row = data["ratios"][clock]
        assert 0 < row["min"] <= row["median"] <= row["max"]


@pytest.mark.slow
def test_bench_foreign_scan_runs_the_baseline_tree_it_names(tmp_path: Path) -> None:
    """bench_foreign_scan.py --baseline: the child scans with the named tree's opregistry
    (here this checkout's), and a tree without opregistry is refused, never measured as
    this one."""
    import bench_foreign_scan

    runner = bench_foreign_scan.Runner(tmp_path / "site", tmp_path / "caches")
    (tmp_path / "site").mkdir()
    repo = Path(__file__).resolve().parents[1]
    assert runner.scan("base-all-cold", ["pip"], True, code=repo) > 0
    assert len(runner.inner["base-all-cold"]) == 1
    with pytest.raises(AssertionError, match="not the baseline's opregistry"):
        runner.scan("base-all-cold", ["pip"], True, code=tmp_path / "site")


def test_startup_targets_rebuilds_ratios_from_parts() -> None:
    """(bare + part) / bare, and (bare + ours) / (bare + the floor's), per rep, on bare's import."""
    import startup_targets

    samples = {"bare": [(0.01, 1.01), (0.02, 2.02)], "backends": [(0.02, 1.1), (0.04, 2.2)],
               "floor 10": [(0.5, 1.5), (1.0, 3.0)], "import torch + 10": [(0.6, 1.6), (0.5, 2.5)]}
    found = startup_targets.part_ratios(samples, [10])
    assert set(found) == {"backends / bare", "import torch + 10 / floor 10"}
    assert found["backends / bare"]["cpu"] == pytest.approx(1.02)
    row = found["import torch + 10 / floor 10"]
    assert (row["cpu_min"], row["cpu_max"]) == pytest.approx((2.5 / 3.0, 1.6 / 1.5))


@pytest.mark.slow
def test_startup_targets_children_time_their_parts() -> None:
    """The in-process children print opregistry's (the floor's) part and the whole import."""
    import subprocess

    import startup_targets

    for code, args in ((startup_targets.PART, []), (startup_targets.FLOOR_PART, ["20"])):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=300, cwd=benchops.neutral_cwd())
        assert done.returncode == 0, done.stderr[-3000:]
        part, whole = map(float, done.stdout.split()[-2:])
        assert 0 < part < whole


def test_objects_per_op_counts_what_the_ops_keep(tmp_path: Path) -> None:
    """objects_per_op.py loads the generated ops and counts, by type, what they keep alive."""
    data = _script("objects_per_op.py", "--dists", "2", "--ops-per-dist", "3", tmp_path=tmp_path)
    assert data["ops"] >= 6 and data["objects"] > 0
    by_type = data["by_type"]
    # one state object per Autograd kernel and one per vmap rule (not a closure's cells)
    assert by_type.get("_Op", 0) >= 6 and by_type.get("_VmapRule", 0) >= 6
    # a warm load, as at import torch: the registry keeps no plan record per op
    assert data["plan_cache"] == "hit"
    assert by_type.get("OpPlan", 0) == by_type.get("KernelPlan", 0) == 0, by_type


def test_raw_floor_registers_and_counts(tmp_path: Path) -> None:
    """raw_floor.py times bare import torch beside N raw registrations, and counts their objects."""
    data = _script("raw_floor.py", "--ops", "20", "--reps", "1", tmp_path=tmp_path)
    assert data["ops"] == 20
    processes = data["processes"]
    bare, raw = processes["import torch (bare)"], processes["import torch + 20 raw ops"]
    assert bare["seconds"] > 0 and raw["seconds"] > 0
    assert raw["objects"] > bare["objects"]  # the registrations keep objects alive


def test_import_lock_floor_times_both_sides(tmp_path: Path) -> None:
    """import_lock_floor.py times the floor's registrations after and during torch's import."""
    data = _script("import_lock_floor.py", "--ops", "20", "--reps", "1", tmp_path=tmp_path)
    assert data["ops"] == 20
    assert all(len(v) == 1 and v[0] > 0 for v in data["seconds"].values())
    assert set(data["seconds"]) == {"after", "initializing"}


def test_scaling_plot_data_match_the_tables() -> None:
    """The plot's ratio row is computed from the committed runs as performance.md quotes them."""
    import json

    import plot_scaling

    docs = Path(__file__).resolve().parents[1] / "docs"
    for name in ("scaling.json", "scaling-before.json"):
        rows = json.loads((docs / "img" / name).read_text())["rows"]
        assert [r["ops"] for r in rows] == [100, 1000, 10000], name
        for group, base in plot_scaling.BASELINES.items():
            ratios = plot_scaling.relative(rows, group)
            assert base not in ratios and ratios, (name, group)
            for series, values in ratios.items():
                assert values == [r[group][series] / r[group][base] for r in rows]
    page = (docs / "performance.md").read_text()
    now = json.loads((docs / "img" / "scaling.json").read_text())["rows"]
    startup = plot_scaling.relative(now, "startup")["import torch + N ops"]
    # the table's "now" column for import torch + 10,000 ops is this file's ratio
    assert f"→ **{startup[-1]:.2f}**" in page


def test_garbage_collector_is_restored_after_load(dists: DistFactory, ns: str) -> None:
    """load() pauses the cyclic collector for speed and always turns it back on."""
    import gc

    import opregistry

    module = f"{ns}_gc"
    dists.make(f"gc-{ns}", ops={ns: f"{module}:lib"},
               modules={module: benchops.registry_source(ns, full=True)})
    assert gc.isenabled()
    load(dists)
    assert gc.isenabled()
    # a strict load that fails in resolution still restores it
    dists.make(f"gc2-{ns}", ops={ns: f"{module}2:lib"},
               modules={f"{module}2": benchops.registry_source(ns, full=True)})
    with pytest.raises(opregistry.ResolutionError):
        load(dists, strict=True)
    assert gc.isenabled()
    # and a caller that had it off finds it off
    gc.disable()
    try:
        load(dists)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_load_leaves_its_objects_in_the_oldest_generation(dists: DistFactory, ns: str) -> None:
    """What a load allocates while the collector is paused is moved to the oldest generation
    when it ends, without a collection traversing it (at 10,000 ops the young one that did
    set off a full collection right after the load); objects the application froze stay
    frozen."""
    import gc

    module = f"{ns}_old"
    dists.make(f"old-{ns}", ops={ns: f"{module}:lib"},
               modules={module: benchops.registry_source(ns, full=True)})
    young = [{"an object of the application's": n} for n in range(3)]
    registry = load(dists)
    kept = {id(o) for g in (0, 1) for o in gc.get_objects(generation=g)}
    assert id(registry) not in kept and id(registry.plan) not in kept
    assert not {id(o) for o in young} & kept
    gc.freeze()  # the application's pre-fork heap, say: with ``young`` in it
    try:
        load(dists)
        assert gc.get_freeze_count()
        assert not {id(o) for o in young} & {id(o) for o in gc.get_objects()}  # still frozen
    finally:
        gc.unfreeze()


def test_a_load_leaves_nothing_for_the_cyclic_collector(dists: DistFactory, ns: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor, its steps and the records they name are freed when the load returns.

    Freed by reference counting, not left in a reference cycle for the next
    collection: at 10,000 ops that was ~135,000 objects, collected in one
    0.2 s pass right after ``import torch`` (docs/performance.md).
    """
    import gc
    import weakref

    from opregistry import materializer

    module = f"{ns}_cyc"
    dists.make(f"cyc-{ns}", ops={ns: f"{module}:lib"},
               modules={module: benchops.registry_source(ns, full=True)})
    executors: list[weakref.ref[Any]] = []
    run = materializer.Executor.run

    def tracked(self: Any) -> Any:
        executors.append(weakref.ref(self))
        return run(self)

    monkeypatch.setattr(materializer.Executor, "run", tracked)
    gc.collect()
    gc.disable()
    try:
        registry = load(dists)
        assert registry.op(f"{ns}::one") is not None
        assert executors and [r() for r in executors] == [None] * len(executors)
    finally:
        gc.enable()


def test_timed_children_do_not_import_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --baseline comparison times each checkout's own core, wherever it is run from.

    ``python -c`` / ``-m`` put the working directory first on ``sys.path``; the
    start-up benchmarks run their children elsewhere, so an ``opregistry``
    package in the caller's directory (a checkout's root) shadows nothing.
    """
    import bench_startup

    poison = tmp_path / "opregistry"
    poison.mkdir()
    (poison / "__init__.py").write_text("raise SystemExit('imported from the working directory')\n")
    monkeypatch.chdir(tmp_path)
    env = benchops.environ([Path(benchops.__file__).parent])
    # raises CalledProcessError if the child imported the poison package
    bench_startup.run([sys.executable, "-c", "import opregistry"], env)
    bench_startup.run([sys.executable, "-m", "opregistry", "--version"], env)


def test_autograd_layer_floor_times_torchs_pieces(tmp_path: Path) -> None:
    """autograd_layer_floor.py times the torch calls a Python Autograd kernel pays for."""
    data = _script("autograd_layer_floor.py", "--number", "200", "--reps", "1",
                   tmp_path=tmp_path)
    assert data["torch"] == torch.__version__
    times = data["us"]
    assert {"cpu only", "Autograd kernel", "Autograd kernel, with_keyset", "keyset.raw_repr()",
            "torch.is_grad_enabled()", "with_keyset + raw_repr"} <= set(times)
    assert all(us > 0 for name, us in times.items() if name != "with_keyset + raw_repr")
    assert times["with_keyset + raw_repr"] == pytest.approx(
        times["Autograd kernel, with_keyset"] - times["Autograd kernel"]
        + times["keyset.raw_repr()"])


def test_bench_schema_parse_times_the_parser(tmp_path: Path) -> None:
    """bench_schema_parse.py parses distinct schemas (the memo never answers), here and in a
    baseline checkout (this one again: the ratio is about 1)."""
    sys.path.insert(0, str(BENCH))
    import bench_schema_parse

    texts = bench_schema_parse.schemas(40)
    assert len(set(texts)) == 40  # distinct: what is timed is the parser, not its memo
    for text in texts:
        parse_signature(text)  # every template is a schema the parser takes
    data = _script("bench_schema_parse.py", "--count", "40", "--reps", "1", "--baseline",
                   str(BENCH.parent), tmp_path=tmp_path)
    assert data["this us/schema"] > 0 and data["baseline us/schema"] > 0
    assert data["this/baseline"] > 0
