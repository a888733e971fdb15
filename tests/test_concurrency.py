"""Concurrency and lifetime: load() from threads, processes and DataLoader workers.

* ``load()`` from several threads at once resolves and registers once; every
  thread gets the same registry; torch's dispatcher holds one kernel per key.
* A second ``load()`` is a no-op.
* ``load()`` works in a ``spawn``-ed child process and in DataLoader workers
  (fork and spawn), which start with a fresh or a copied interpreter.
* Ops stay registered while the registry lives, whatever the garbage
  collector does; ``unload()`` removes exactly what was registered.
"""

from __future__ import annotations

import gc
import multiprocessing
import threading
from typing import Any

import pytest
import torch

import opregistry
from opregistry import materializer

from .conftest import DistFactory

KERNELS = "import torch\n\ndef plus_one(x):\n    return x + 1\n\ndef fake(x):\n    return torch.empty_like(x)\n"


def make_dist(dists: DistFactory, ns: str) -> list[str]:
    """One op ``<ns>::inc`` with a CPU and a fake kernel; returns the plugin scope."""
    kmod, module = f"k_{ns}", f"conc_{ns}"
    dists.make("conc", ops={"ops": f"{module}:lib"}, modules={
        module: "from opregistry import OpLibrary\n"
                f"lib = OpLibrary({ns!r})\n"
                f"lib.define('inc(Tensor x) -> Tensor', kernels={{'cpu': '{kmod}:plus_one'}}, "
                f"fake='{kmod}:fake')\n",
        kmod: KERNELS})
    return ["opregistry-cpu", "opregistry-meta", *dists.names]


def kernel_lines(qualname: str) -> list[str]:
    """The registered kernels of ``qualname`` in torch's dispatch table (active and shadowed)."""
    dump = torch._C._dispatch_dump(qualname)
    return [line for line in dump.splitlines() if line.split(":")[0].split(" ")[0] in ("CPU", "Meta")]


@pytest.fixture
def count_materialize(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = materializer.materialize

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(materializer, "materialize", counting)
    return calls


def test_load_from_many_threads_registers_once(dists, ns, count_materialize):
    """Eight threads call load() at the same moment: one registration, one registry."""
    scope = make_dist(dists, ns)
    barrier = threading.Barrier(8)
    results: list[Any] = [None] * 8

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = opregistry.load(plugins=scope)
        except BaseException as exc:  # reported below, with the thread's index
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(isinstance(r, opregistry.Registry) for r in results), results
    assert len({id(r) for r in results}) == 1
    assert count_materialize == [1]
    assert len(kernel_lines(f"{ns}::inc")) == 2, "one CPU and one Meta kernel, no shadowed copies"
    assert torch.equal(getattr(torch.ops, ns).inc(torch.zeros(2)), torch.ones(2))


def test_second_load_is_a_no_op(dists, ns, count_materialize):
    scope = make_dist(dists, ns)
    first = opregistry.load(plugins=scope)
    table = torch._C._dispatch_dump(f"{ns}::inc")
    assert opregistry.load(plugins=scope) is first
    assert opregistry.load() is first, "later arguments are ignored without reload=True"
    assert count_materialize == [1]
    assert torch._C._dispatch_dump(f"{ns}::inc") == table


def _child(ns: str, queue: Any) -> None:
    """Runs in a spawned interpreter: nothing registered until load()."""
    import torch

    import opregistry

    before = hasattr(getattr(torch.ops, ns), "inc")
    reg = opregistry.load()
    out = getattr(torch.ops, ns).inc(torch.zeros(3))
    queue.put((before, len(reg.errors), out.tolist(), opregistry.load() is reg))


@pytest.mark.slow
def test_load_in_a_spawned_process(dists, ns, monkeypatch):
    """A spawned child (fresh interpreter, as torch.multiprocessing uses) loads the same ops."""
    scope = make_dist(dists, ns)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(scope))
    monkeypatch.setenv("OPREGISTRY_AUTOLOAD", "0")  # so that the child's load() is what registers
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(ns, queue))
    child.start()
    try:
        before, errors, out, same = queue.get(timeout=120)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    assert (before, errors, out, same) == (False, 0, [1.0, 1.0, 1.0], True)


class IncDataset(torch.utils.data.Dataset):
    """Each item calls the registered op; the worker loads the registry if it must."""

    def __init__(self, ns: str) -> None:
        self.ns = ns

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        opregistry.load()
        return getattr(torch.ops, self.ns).inc(torch.full((2,), float(i)))


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(dists, ns, monkeypatch, context):
    """DataLoader(num_workers=2): forked workers inherit the ops, spawned ones load them."""
    scope = make_dist(dists, ns)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(scope))
    opregistry.load(plugins=scope)
    loader = torch.utils.data.DataLoader(IncDataset(ns), batch_size=None, num_workers=2,
                                         multiprocessing_context=context)
    got = [t.tolist() for t in loader]
    assert got == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]


def test_ops_outlive_garbage_collection(dists, ns):
    """The registry keeps its Library objects alive: a collected Library would unregister."""
    scope = make_dist(dists, ns)
    opregistry.load(plugins=scope)  # no reference kept here
    gc.collect()
    assert f"{ns}::inc" in torch._C._dispatch_get_all_op_names()
    assert torch.equal(getattr(torch.ops, ns).inc(torch.zeros(1)), torch.ones(1))
    assert opregistry.get_registry() is not None


def test_unload_removes_exactly_what_was_registered(dists, ns):
    """Ops and kernels registered outside opregistry survive unload(); ours are gone."""
    outside = torch.library.Library(f"{ns}_outside", "DEF")
    outside.define("keep(Tensor x) -> Tensor")
    outside.impl("keep", lambda x: x, "CPU")
    try:
        scope = make_dist(dists, ns)
        ops_before = set(torch._C._dispatch_get_all_op_names())
        add_table = torch._C._dispatch_dump("aten::add.Tensor")
        reg = opregistry.load(plugins=scope)
        assert set(torch._C._dispatch_get_all_op_names()) - ops_before == {f"{ns}::inc"}
        reg.unload()
        gc.collect()
        assert set(torch._C._dispatch_get_all_op_names()) == ops_before
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}_outside::keep", "CPU")
        assert torch._C._dispatch_dump("aten::add.Tensor") == add_table
        assert opregistry.get_registry() is None
        # and loading again after unload works: nothing stale is left behind
        again = opregistry.load(plugins=scope)
        assert again is not reg and f"{ns}::inc" in torch._C._dispatch_get_all_op_names()
    finally:
        outside._destroy()


@pytest.mark.slow
def test_load_unload_sequences_keep_torch_consistent(dists, ns):
    """Any sequence of load / reload / unload / gc leaves torch holding the op iff loaded."""
    from hypothesis import settings
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

    scope = make_dist(dists, ns)
    qualname = f"{ns}::inc"
    baseline = set(torch._C._dispatch_get_all_op_names()) - {qualname}

    class Lifetime(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loaded: opregistry.Registry | None = None

        @rule()
        def load(self) -> None:
            reg = opregistry.load(plugins=scope)
            assert self.loaded is None or reg is self.loaded
            self.loaded = reg

        @rule()
        def reload(self) -> None:
            self.loaded = opregistry.load(plugins=scope, reload=True)

        @rule()
        def unload(self) -> None:
            if self.loaded is not None:
                self.loaded.unload()
                self.loaded = None

        @rule()
        def collect_garbage(self) -> None:
            gc.collect()

        @invariant()
        def torch_agrees(self) -> None:
            ops = set(torch._C._dispatch_get_all_op_names())
            assert (qualname in ops) == (self.loaded is not None)
            assert ops - {qualname} == baseline, "nothing else added or removed"
            assert opregistry.get_registry() is self.loaded
            if self.loaded is not None:
                assert len(kernel_lines(qualname)) == 2

        def teardown(self) -> None:
            if self.loaded is not None:
                self.loaded.unload()

    run_state_machine_as_test(Lifetime, settings=settings(max_examples=10, stateful_step_count=8,
                                                          deadline=None, database=None))
