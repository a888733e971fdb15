"""Declarations are owned: another distribution's code cannot declare through a library, or
change opregistry's state, unseen -- in every discovery order (opregistry.ownership, .seal)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import opregistry
import opregistry.declare
import opregistry.keys

from .conftest import BACKENDS, DistFactory, KERNELS

VICTIM = """
from opregistry import OpLibrary

lib = OpLibrary(NS)
lib.define("ok(Tensor x) -> Tensor", kernels={"cpu": "KMOD:clone"}, fake="KMOD:fake")
"""


class World:
    """A victim and an attacker, each in a sys.path entry of its own, in a chosen order."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ns: str,
                 attacker_first: bool) -> None:
        self.ns = ns
        self.kmod = f"{ns}_kernels"
        roots = [DistFactory(tmp_path / "one", monkeypatch), DistFactory(tmp_path / "two", monkeypatch)]
        for factory in roots:
            factory.root.mkdir()
        # the factory made last is first on sys.path: discovered first
        self.victims, self.attackers = roots if attacker_first else roots[::-1]
        self.victim = self.victims.make("victim", ops={"ops": f"victim_{ns}:lib"}, modules={
            f"victim_{ns}": VICTIM.replace("NS", repr(ns)).replace("KMOD", self.kmod),
            self.kmod: KERNELS})
        self.attacker = ""

    def attack(self, body: str, modules: dict[str, str] | None = None) -> str:
        """The attacker's declarations module: ``body``, then a library of its own."""
        source = body.replace("VICTIM", f"victim_{self.ns}").replace("KMOD", self.kmod) + \
            f"from opregistry import OpLibrary as _L\nlib = _L('{self.ns}att')\n"
        self.attacker = self.attackers.make("attacker", ops={"ops": f"attacker_{self.ns}:lib"},
                                            modules={f"attacker_{self.ns}": source,
                                                     **(modules or {})})
        return self.attacker

    def plugins(self) -> list[str]:
        return [*BACKENDS, self.victim, self.attacker]

    def cleanup(self) -> None:
        self.attackers.cleanup()
        self.victims.cleanup()


@pytest.fixture(params=[True, False], ids=["attacker-first", "victim-first"])
def world(request, tmp_path, monkeypatch, ns):  # type: ignore[no-untyped-def]
    w = World(tmp_path, monkeypatch, ns, request.param)
    yield w
    w.cleanup()


def _left_out(resolved) -> set[str]:  # type: ignore[no-untyped-def]
    return {o.distribution for p in resolved.errors for o in p.culprits}


def _check_victim_intact(world: World, resolved) -> None:  # type: ignore[no-untyped-def]
    ok = resolved.op(f"{world.ns}::ok")
    assert ok is not None and ok.op.origin.distribution == world.victim
    assert world.victim not in _left_out(resolved), "the victim is not blamed"
    assert {k.kernel.fn for k in ok.kernels} == {f"{world.kmod}:clone", f"{world.kmod}:fake"}


def test_a_declaration_through_another_distributions_library(world: World) -> None:
    """The issue's attack: victim::evil, credited to the victim -- refused, the attacker blamed."""
    world.attack("import VICTIM\n"
                 "VICTIM.lib.define('evil(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:twice'})\n")
    resolved = opregistry.plan(plugins=world.plugins())
    [problem] = [p for p in resolved.errors if p.code == "declaration-not-owned"]
    assert f"the op {world.ns}::evil, a CPU kernel for {world.ns}::evil" in problem.message
    assert [o.distribution for o in problem.culprits] == [world.attacker]
    assert [o.distribution for o in problem.others] == [world.victim]
    assert problem.source is not None and problem.source.endswith(f"attacker_{world.ns}.py:2")
    assert resolved.op(f"{world.ns}::evil") is None
    assert world.attacker in _left_out(resolved)
    _check_victim_intact(world, resolved)


def test_a_kernel_through_another_distributions_library_is_not_registered(world: World) -> None:
    """At load: the victim's op runs the victim's kernel; the attacker's never reaches torch."""
    world.attack("import VICTIM\nVICTIM.lib.impl('ok', 'cpu', 'KMOD:twice', override=True)\n")
    registry = opregistry.load(plugins=world.plugins(), reload=True)
    assert "declaration-not-owned" in {p.code for p in registry.errors}
    x = torch.arange(3.0)
    assert torch.equal(getattr(torch.ops, world.ns).ok(x), x), "the victim's own kernel runs"


def test_a_hook_put_on_another_distributions_library(world: World) -> None:
    """``victim.lib.opregistry_ops = ...``: the attacker's function is refused; the victim's
    library answers with its own hooks."""
    world.attack("import VICTIM\nfrom opregistry import OpDef\n"
                 "def _evil():\n"
                 f"    return [OpDef(namespace={world.ns!r}, name='evil', schema='(Tensor x) -> Tensor')]\n"
                 "VICTIM.lib.opregistry_ops = _evil\n")
    resolved = opregistry.plan(plugins=world.plugins())
    [problem] = [p for p in resolved.errors if p.code == "declaration-not-owned"]
    assert [o.distribution for o in problem.culprits] == [world.attacker]
    assert "opregistry_ops" in problem.message
    assert resolved.op(f"{world.ns}::evil") is None
    _check_victim_intact(world, resolved)


def test_samples_chosen_through_another_distributions_handle(world: World) -> None:
    """register_samples on the victim's op (code that `opregistry check` runs): refused."""
    world.attack("import VICTIM\n"
                 "VICTIM.lib._ops  # noqa\n"
                 "from opregistry import OpHandle\n"
                 f"OpHandle(VICTIM.lib, VICTIM.lib._ops['{world.ns}::ok']).register_samples('KMOD:clone')\n")
    resolved = opregistry.plan(plugins=world.plugins())
    assert world.attacker in _left_out(resolved)
    ok = resolved.op(f"{world.ns}::ok")
    assert ok is not None and ok.op.samples is None, "the victim's op as the victim declared it"


def test_a_helper_module_nobody_owns(world: World) -> None:
    """The attacker declares through a helper module on sys.path that no distribution lists:
    the attacker's module called it (the frames of the declaring code are kept)."""
    helper = f"helper_{world.ns}"
    (world.attackers.root / f"{helper}.py").write_text(
        "def declare(lib):\n"
        "    lib.define('evil(Tensor x) -> Tensor', kernels={'cpu': 'x:y'})\n")
    world.attackers.modules.append(helper)
    world.attack(f"import VICTIM, {helper}\n{helper}.declare(VICTIM.lib)\n")
    resolved = opregistry.plan(plugins=world.plugins())
    assert resolved.op(f"{world.ns}::evil") is None
    assert world.attacker in _left_out(resolved)
    _check_victim_intact(world, resolved)


@pytest.mark.parametrize("tamper", [
    "import opregistry\nopregistry.OpLibrary = None\n",
    "import opregistry.declare\nvars(opregistry.declare)['OpLibrary'] = None\n",
    "import opregistry\ndel opregistry.OpLibrary\n",
    "import opregistry\nopregistry.OpLibrary.define = lambda self, *a, **k: None\n",
    "import opregistry.keys\nopregistry.keys.ALIASES['cpu'] = 'CUDA'\n",
    "import opregistry.resolver.impls\nopregistry.resolver.impls.check_kernels = lambda *a: ({}, ())\n",
])
def test_a_change_to_opregistrys_state_is_undone_and_attributed(world: World, tamper: str) -> None:
    """The attacker's import changes opregistry itself: put back at once, the attacker named;
    the victim loads as it would have, whichever is discovered first."""
    world.attack(tamper)
    resolved = opregistry.plan(plugins=world.plugins())
    [problem] = [p for p in resolved.errors if p.code == "opregistry-state-changed"]
    assert [o.distribution for o in problem.culprits] == [world.attacker]
    if "vars(" not in tamper and "ALIASES" not in tamper:  # a plain assignment: its line
        assert problem.source is not None and f"attacker_{world.ns}.py:" in problem.source
    assert world.attacker in _left_out(resolved)
    _check_victim_intact(world, resolved)
    assert opregistry.OpLibrary is opregistry.declare.OpLibrary
    assert opregistry.keys.ALIASES["cpu"] == "CPU"
    assert opregistry.OpLibrary.define.__module__ == "opregistry.declare"


def test_a_change_made_by_a_module_another_plugin_imports_is_its_writers(
        world: World) -> None:
    """A third distribution imports the attacker's module, whose import rebinds opregistry.X:
    the writer's file names the attacker, not the distribution being imported."""
    world.attack("import opregistry\nopregistry.OpLibrary = None\n")
    carrier = world.victims.make("carrier", ops={"ops": f"carrier_{world.ns}:lib"}, modules={
        f"carrier_{world.ns}": f"import attacker_{world.ns}\n"
                               f"from opregistry import OpLibrary\n"
                               f"lib = OpLibrary('{world.ns}car')\n"})
    resolved = opregistry.plan(plugins=[*world.plugins(), carrier])
    culprits = {o.distribution for p in resolved.errors if p.code == "opregistry-state-changed"
                for o in p.culprits}
    assert culprits == {world.attacker}
    assert carrier not in _left_out(resolved)


def test_no_false_attribution(world: World) -> None:
    """What a distribution's own code declares stays its own: through a helper module nobody
    owns that its module calls, from another module of its package, while another
    distribution's import imports it first."""
    helper = f"shared_helper_{world.ns}"
    (world.victims.root / f"{helper}.py").write_text(
        "def declare(lib, name):\n"
        "    lib.define(name + '(Tensor x) -> Tensor', kernels={'cpu': 'x:y'})\n")
    world.victims.modules.append(helper)
    module = world.victims.root / f"victim_{world.ns}.py"
    module.write_text(module.read_text() + f"import {helper}\n{helper}.declare(lib, 'helped')\n")
    # the attacker role here: a distribution that imports the victim first, and does nothing
    world.attack("import VICTIM\n")
    resolved = opregistry.plan(plugins=world.plugins())
    assert not resolved.errors, [str(p) for p in resolved.errors]
    assert resolved.op(f"{world.ns}::helped").op.origin.distribution == world.victim
    _check_victim_intact(world, resolved)


def test_records_stamped_with_another_origin_are_the_returners(world: World) -> None:
    """A hook returns records already carrying the victim's Origin: they are the attacker's."""
    world.attack("from opregistry import OpDef, Origin\n"
                 "def _mine():\n"
                 f"    return [OpDef(namespace='{world.ns}att', name='x', schema='(Tensor a) -> Tensor',\n"
                 f"                  origin=Origin(distribution='victim', version='1.0'))]\n")
    module = world.attackers.root / f"attacker_{world.ns}.py"
    module.write_text(module.read_text() + "lib.opregistry_ops = _mine\n")
    resolved = opregistry.plan(plugins=world.plugins())
    op = resolved.op(f"{world.ns}att::x")
    assert op is not None and op.op.origin.distribution == world.attacker
    _check_victim_intact(world, resolved)


def test_the_seal_leaves_python_alone(world: World) -> None:
    """A plugin that adds to ``builtins`` (torch 2.8's import does) is not opregistry's business:
    the seal covers opregistry's own tables, never ``__builtins__``."""
    world.attack("import builtins\nbuiltins._opregistry_seal_probe = 1\n")
    try:
        resolved = opregistry.plan(plugins=world.plugins())
        assert not resolved.errors, [str(p) for p in resolved.errors]
        import builtins

        assert builtins.isinstance is isinstance and builtins._opregistry_seal_probe == 1
    finally:
        import builtins

        vars(builtins).pop("_opregistry_seal_probe", None)
