"""The fault matrix of issue 6: every bad plugin contained, checked in torch's dispatcher.

Each case builds real distributions (``*.dist-info`` with entry points) next
to a healthy *bystander* distribution, and every case is run three ways:

* default mode: the faulty distribution is left out whole -- none of its ops
  in ``torch._C._dispatch_get_all_op_names()``, none of its kernels in effect
  -- the bystander loads, and the problem names the distribution
  (``name==version``), its entry point and, where the fault has a line, the
  ``file:line`` of it;
* strict mode: :class:`~opregistry.ResolutionError` with the same problem,
  and nothing registered (not even the bystander);
* ``opregistry doctor`` reports the problem and exits non-zero.

``docs/reliability.md`` holds the table of these cases; ``test_docs_table``
checks that the table and :data:`CASES` agree, id for id and code for code.
Some cases are also tested in more depth in ``tests/test_conflicts.py``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from attrs import field, frozen

import opregistry
from opregistry import ResolutionError
from opregistry.keys import (ALL_TAGS, TAG_SINCE, TYPE_SINCE, TYPE_UNTIL, tag_since, type_since,
                             type_until)
from opregistry.model import Problem

from . import conftest
from .conftest import STRICT_IMPORT_PROBE, DistFactory, load, plan

KERNELS = conftest.KERNELS + """
def fake2(x):
    return torch.empty_like(x)

def sub(a, b, alpha=1):
    return a.sub(b)

not_callable = 42
"""

#: the ``lib = OpLibrary(...)`` line of a module written by :meth:`Env.op_dist`
LIBRARY_LINE = 2
#: the first line of the body after it
BODY_LINE = 3


def all_ops() -> set[str]:
    return set(torch._C._dispatch_get_all_op_names())


@frozen
class Fault:
    """What a case must produce."""

    culprits: frozenset[str] = field(converter=frozenset)
    #: ops that must not exist in torch's dispatcher afterwards
    absent: tuple[str, ...] = ()
    #: ``module.py:line`` the problem must point at
    source: str | None = None
    #: the problem names an entry point of the culprit
    entry_point: bool = True
    #: checks on torch's state that the faulty kernels are not in effect
    unchanged: Callable[[], None] | None = None
    #: a fragment the message must contain (torch's own words, the bad name)
    says: str = ""
    #: ops the plugin registers with torch itself, outside opregistry (not ours to undo)
    foreign: tuple[str, ...] = ()
    #: found only when registering: ``doctor`` needs ``--live``
    live: bool = False


class Env:
    """Builds the distributions of one case in the test's unique namespace."""

    def __init__(self, dists: DistFactory, ns: str, request: pytest.FixtureRequest) -> None:
        self.dists = dists
        self.ns = ns
        self.request = request
        self.kmod = f"{ns}_kernels"

    def module_name(self, dist: str) -> str:
        return f"{dist.replace('-', '_')}_{self.ns}"

    def op_dist(self, dist: str, body: str, *, namespace: str | None = None, kind: str = "DEF",
                version: str = "1.0", modules: dict[str, str] | None = None) -> str:
        """A distribution with one entry point naming an ``OpLibrary``; body from line 3.

        ``modules`` adds modules of the distribution's own (a faulty kernel module);
        ``NS`` in their source stands for the case's namespace.
        """
        namespace = self.ns if namespace is None else namespace
        module = self.module_name(dist) + (f"_{version.replace('.', '_')}" if version != "1.0" else "")
        source = (f"from opregistry import OpLibrary\nlib = OpLibrary({namespace!r}, {kind!r})\n"
                  + body.replace("KMOD", self.kmod).replace("NS", self.ns))
        extra = {name.replace("NS", self.ns): text.replace("NS", self.ns)
                 for name, text in (modules or {}).items()}
        return self.dists.make(dist, version=version, ops={"ops": f"{module}:lib"},
                               modules={module: source, self.kmod: KERNELS, **extra})

    def raw_dist(self, dist: str, source: str, attr: str = "") -> str:
        """A distribution whose entry point names a plain module (hooks as functions)."""
        module = self.module_name(dist)
        value = f"{module}:{attr}" if attr else module
        return self.dists.make(dist, ops={"ops": value},
                               modules={module: source.replace("KMOD", self.kmod),
                                        self.kmod: KERNELS})

    def at(self, dist: str, line: int) -> str:
        return f"{self.module_name(dist)}.py:{line}"

    def op(self, name: str) -> str:
        return f"{self.ns}::{name}"


def define(name: str, kernels: str = "{'cpu': 'KMOD:clone'}", extra: str = "",
           schema: str = "(Tensor x) -> Tensor") -> str:
    return f"lib.define('{name}{schema}', kernels={kernels}{extra})\n"


# -- the cases ----------------------------------------------------------------


def malformed_schema(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define("foo", schema="(Tensor x -> Tensor"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def unknown_type(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define("foo", schema="(Tensr x) -> Tensor"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def duplicate_argument_names(env: Env) -> Fault:
    # torch.library accepts this schema, then opcheck fails on it: opregistry refuses it on
    # purpose (schema.DELIBERATE_REFUSALS)
    d = env.op_dist("bad", define("ok") + define("foo", schema="(Tensor x, Tensor x) -> Tensor"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="appears twice")


def alias_disagrees_with_mutates_args(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema="(Tensor(a!) x) -> ()", kernels="{}", extra=", mutates_args=()"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def missing_module(env: Env) -> Fault:
    d = env.dists.make("bad", ops={"ops": f"no_such_module_{env.ns}:lib"})
    return Fault({d})


def missing_attribute(env: Env) -> Fault:
    d = env.raw_dist("bad", "x = 1\n", attr="lib")
    return Fault({d})


def import_raises(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + "raise RuntimeError('kaput')\n")
    return Fault({d}, absent=(env.op("ok"),), source=env.at(d, BODY_LINE + 1))


def hookimpl_raises(env: Env) -> Fault:
    d = env.raw_dist("bad", "def opregistry_ops():\n    raise RuntimeError('kaput')\n")
    return Fault({d}, source=env.at(d, 2), says="kaput")


def hookimpl_wrong_argument(env: Env) -> Fault:
    d = env.raw_dist("bad", "x = 1\n\ndef opregistry_ops(nope):\n    return []\n")
    return Fault({d}, source=env.at(d, 3), says="nope")


def two_def_of_one_namespace(env: Env) -> Fault:
    a = env.op_dist("dist-a", define("foo"))
    b = env.op_dist("dist-b", define("bar"))
    return Fault({a, b}, absent=(env.op("foo"), env.op("bar")), source=env.at(a, LIBRARY_LINE))


def fragment_redefines_op(env: Env) -> Fault:
    env.op_dist("owner", define("foo"))
    d = env.op_dist("frag", define("extra") + define("foo"), kind="FRAGMENT")
    return Fault({d}, absent=(env.op("extra"),), source=env.at(d, BODY_LINE + 1))


def _def_of(namespace: str) -> Callable[[Env], Fault]:
    def case(env: Env) -> Fault:
        name = f"mine_{env.ns}"
        d = env.op_dist("bad", define(name), namespace=namespace)
        return Fault({d}, absent=(f"{namespace}::{name}",), source=env.at(d, LIBRARY_LINE))

    return case


def def_of_namespace_held_outside(env: Env) -> Fault:
    """A ``Library(ns, "DEF")`` made outside opregistry before load holds the namespace."""
    held = torch.library.Library(env.ns, "DEF")
    held.define("held(Tensor x) -> Tensor")
    env.request.addfinalizer(held._destroy)
    d = env.op_dist("bad", define("foo"))

    def unchanged() -> None:
        assert env.op("held") in all_ops()

    return Fault({d}, absent=(env.op("foo"),), unchanged=unchanged, source=env.at(d, LIBRARY_LINE))


def two_kernels_for_one_key(env: Env) -> Fault:
    env.op_dist("owner", define("foo"))
    d = env.op_dist("intruder", f"lib.impl('{env.ns}::foo', 'cpu', 'KMOD:twice')\n", kind="IMPL")

    def unchanged() -> None:
        x = torch.ones(3)
        assert torch.equal(getattr(torch.ops, env.ns).foo(x), x), "the owner's kernel runs"

    return Fault({d}, source=env.at(d, BODY_LINE), unchanged=unchanged)


def composite_implicit_beside_device_kernel(env: Env) -> Fault:
    env.op_dist("owner", define("foo", kernels="{'CompositeImplicitAutograd': 'KMOD:clone'}"))
    d = env.op_dist("intruder", f"lib.impl('{env.ns}::foo', 'cpu', 'KMOD:twice')\n", kind="IMPL")

    def unchanged() -> None:
        x = torch.ones(3)
        assert torch.equal(getattr(torch.ops, env.ns).foo(x), x), "the decomposition runs"
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(env.op("foo"), "CPU")

    return Fault({d}, source=env.at(d, BODY_LINE), unchanged=unchanged,
                 says="CompositeImplicitAutograd")


def composite_implicit_with_fake(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define(
        "foo", kernels="{'CompositeImplicitAutograd': 'KMOD:clone'}", extra=", fake='KMOD:fake'"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="Meta")


def kernel_for_undefined_op(env: Env) -> Fault:
    d = env.op_dist("bad", f"lib.impl('{env.ns}::nope', 'cpu', 'KMOD:clone')\n", kind="IMPL")
    return Fault({d}, absent=(env.op("nope"),), source=env.at(d, BODY_LINE))


def unknown_dispatch_key(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define("foo", kernels="{'gpu': 'KMOD:clone'}"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def bad_condition_spec(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define(
        "foo", kernels="{'cpu': 'KMOD:clone'}", extra=", fake='KMOD:fake'")
        + "lib.impl('foo', 'cpu', 'KMOD:twice', when={'torch': '>=2.x'})\n")
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 2),
                 says="not a version comparison")


def condition_on_torch_op(env: Env) -> Fault:
    d = env.op_dist("evil", "lib.impl('add.Tensor', 'cpu', 'KMOD:sub', predicate='KMOD:clone')\n",
                    namespace="aten", kind="IMPL")

    def unchanged() -> None:
        assert torch.equal(torch.ones(2) + torch.ones(2), torch.full((2,), 2.0))

    return Fault({d}, source=env.at(d, BODY_LINE), unchanged=unchanged, says="an op torch owns")


def misspelt_dispatch_key(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define("foo", kernels="{'CPu': 'KMOD:clone'}"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="did you mean 'CPU'")


def aten_add_without_policy(env: Env) -> Fault:
    d = env.op_dist("evil", "lib.impl('add.Tensor', 'cpu', 'KMOD:sub', override=True)\n",
                    namespace="aten", kind="IMPL")

    def unchanged() -> None:
        assert torch.equal(torch.ones(2) + torch.ones(2), torch.full((2,), 2.0))

    return Fault({d}, source=env.at(d, BODY_LINE), unchanged=unchanged)


def override_without_policy(env: Env) -> Fault:
    env.op_dist("owner", define("foo"))
    d = env.op_dist("patch", f"lib.impl('{env.ns}::foo', 'cpu', 'KMOD:twice', override=True)\n",
                    kind="IMPL")

    def unchanged() -> None:
        x = torch.ones(3)
        assert torch.equal(getattr(torch.ops, env.ns).foo(x), x), "the owner's kernel runs"

    return Fault({d}, source=env.at(d, BODY_LINE), unchanged=unchanged)


def fake_registered_twice(env: Env) -> Fault:
    d = env.op_dist("bad", define("foo", extra=", fake='KMOD:fake'")
                    + "lib.impl('foo', 'fake', 'KMOD:fake2')\n")
    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 1))


def _namespace(name: str) -> Callable[[Env], Fault]:
    def case(env: Env) -> Fault:
        d = env.op_dist("bad", define("foo"), namespace=name)
        return Fault({d}, absent=(f"{name}::foo",), source=env.at(d, LIBRARY_LINE))

    return case


def kernel_ref_unresolvable(env: Env) -> Fault:
    d = env.op_dist("bad", define("foo") + define("bar", "{'cpu': 'KMOD:does_not_exist'}"))
    return Fault({d}, absent=(env.op("foo"), env.op("bar")), source=env.at(d, BODY_LINE + 1),
                 says="does_not_exist")


def kernel_ref_not_callable(env: Env) -> Fault:
    d = env.op_dist("bad", define("foo") + define("bar", "{'cpu': 'KMOD:not_callable'}"))
    return Fault({d}, absent=(env.op("foo"), env.op("bar")), source=env.at(d, BODY_LINE + 1),
                 says="not a callable")


BROKEN_BACKEND = """
from opregistry import Backend, hookimpl
from opregistry.backend import op_name

@hookimpl
def opregistry_backends():
    return [Backend(name="broken-xpu", keys=("XPU",), device_type="xpu")]

#: what torch held when this backend was called: proof that the failure came halfway
seen = []


@hookimpl
def opregistry_materialize_kernel(library, kernel, fn):
    import torch

    ns = kernel.namespace
    seen.append((sorted(op for op in torch._C._dispatch_get_all_op_names()
                        if op.startswith(ns + "::")),
                 torch._C._dispatch_has_kernel_for_dispatch_key(kernel.op, "CPU")))
    # a backend bug torch refuses: a dispatch key torch does not know
    library.impl(op_name(kernel), fn, "XPUU")
    return True
"""


def torch_rejects_halfway(env: Env) -> Fault:
    """torch raises on the 3rd registration: the op defined and kernel registered go away."""
    module = f"broken_backend_{env.ns}"
    env.dists.make("broken-backend", backends={"xpu": module}, modules={module: BROKEN_BACKEND})
    d = env.op_dist("bad", define("foo") + define("bar", "{'cpu': 'KMOD:clone', 'xpu': 'KMOD:clone'}"))

    def unchanged() -> None:
        import importlib

        seen = importlib.import_module(module).seen
        assert seen[-1] == ([env.op("bar"), env.op("foo")], True), (
            "when torch refused, both ops and bar's CPU kernel were registered: rolled back since")

    return Fault({d}, absent=(env.op("foo"), env.op("bar")), source=env.at(d, BODY_LINE + 1),
                 says="XPUU", unchanged=unchanged)


def vmap_kwarg_only_tensor(env: Env) -> Fault:
    # torch.library.register_vmap raises NotImplementedError; the resolver says so first
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema="(*, Tensor x) -> Tensor", extra=", vmap='KMOD:clone'"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def autocast_unknown_device_type(env: Env) -> Fault:
    # torch.library.register_autocast raises ValueError / AttributeError; the declaration says so
    d = env.op_dist("bad", define("ok") + define("foo", extra=", autocast={'vulkan': 'bfloat16'}"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="no autocast dispatch key for device type 'vulkan'")


def autocast_kwarg_only_argument(env: Env) -> Fault:
    # torch's autocast kernel raises "Custom ops do not support kwargs yet" at the first call
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema="(Tensor x, *, float alpha=1.0) -> Tensor",
        extra=", autocast={'cpu': 'bfloat16'}"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="keyword-only")


def autocast_on_mutable_op(env: Env) -> Fault:
    # torch accepts it, then mutates a cast copy: the caller's tensor never changes
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema="(Tensor(a!) x) -> ()", extra=", mutates_args=['x'], "
        "autocast={'cpu': 'float16'}"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="losing the mutation")


def torch_dispatch_rule_module_missing(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define(
        "foo", extra=", torch_dispatch={'no_such_module_NS:Mode': 'KMOD:clone'}"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="no_such_module", live=True)


def torch_dispatch_class_not_a_mode(env: Env) -> Fault:
    # torch.library.register_torch_dispatch accepts any class, and the rule never runs
    d = env.op_dist("bad", define("ok") + define(
        "foo", extra=", torch_dispatch={'KMOD:clone': 'KMOD:clone'}"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="neither a TorchDispatchMode nor a Tensor subclass", live=True)


def triton_kernels_from_two_distributions(env: Env) -> Fault:
    # the second FunctionalTensorMode rule would raise inside torch at registration
    env.op_dist("owner", define("foo", kernels="{}", extra=", triton={'cpu': 'KMOD:clone'}, "
                                "fake='KMOD:fake'"))
    d = env.op_dist("contrib", "lib.impl('NS::foo', 'xpu', 'KMOD:clone', triton=True)\n",
                    kind="IMPL")
    return Fault({d}, source=env.at(d, BODY_LINE), says="must come from one distribution")


def rollback_takes_dependents(env: Env) -> Fault:
    """A distribution whose kernel targets a rolled-back op is rolled back with it."""
    env.op_dist("base", define("foo") + define("bar", "{'cpu': 'KMOD:does_not_exist'}"))
    d = env.op_dist("addon", f"lib.impl('{env.ns}::foo', 'fake', 'KMOD:fake')\n", kind="IMPL")

    def unchanged() -> None:
        from torch._library.simple_registry import singleton

        # addon's fake kernel was registered before base failed; it must be gone too
        assert singleton.find(env.op("foo")).fake_impl.kernel is None

    return Fault({d}, absent=(env.op("foo"), env.op("bar")), unchanged=unchanged)


def registers_with_torch_at_import(env: Env) -> Fault:
    """The plugin itself makes a Library(ns, "DEF") at import: undone, the plugin left out."""
    d = env.op_dist("sneaky", define("foo") + "import torch\n"
                    "_mine = torch.library.Library(NS_REPR, 'DEF')\n"
                    "_mine.define('held(Tensor x) -> Tensor')\n".replace("NS_REPR", repr(env.ns)))

    def destroy() -> None:
        module = sys.modules.get(env.module_name(d))
        if module is not None:
            module._mine._destroy()

    env.request.addfinalizer(destroy)

    def unchanged() -> None:
        # undone: torch has no schema for it any more (torch keeps the bare name)
        assert not torch._C._dispatch_has_kernel(env.op("held")) or \
            "schema: (none)" in torch._C._dispatch_dump(env.op("held"))

    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 2),
                 unchanged=unchanged, says="undid it", foreign=(env.op("held"),))


def plugin_calls_load_at_import(env: Env) -> Fault:
    """Loading from inside a plugin's import would recurse: refused, the plugin left out."""
    d = env.op_dist("eager", define("foo") + "import opregistry\nopregistry.load()\n")
    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 2),
                 says="ReentrantLoadError: opregistry.load() was called while opregistry was importing plugins")


def hookimpl_returns_wrong_type(env: Env) -> Fault:
    d = env.raw_dist("bad", "def opregistry_ops():\n    return [{'name': 'foo'}]\n")
    return Fault({d}, says="must return OpDef records", source=env.at(d, 1))


def unknown_hook_name(env: Env) -> Fault:
    d = env.raw_dist("bad", "def opregistry_op():\n    return []\n")
    return Fault({d}, says="did you mean opregistry_ops", source=env.at(d, 1))


def hook_in_wrong_group(env: Env) -> Fault:
    d = env.raw_dist("bad", "def opregistry_backends():\n    return []\n")
    return Fault({d}, says="opregistry.backends", source=env.at(d, 1))


def unknown_tag(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define("foo", extra=", tags=['pt2_compliant']"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def fragment_of_closed_namespace(env: Env) -> Fault:
    env.op_dist("owner", define("foo"))
    owner_module = env.module_name("owner")
    path = env.dists.root / f"{owner_module}.py"
    path.write_text(path.read_text().replace(f"OpLibrary({env.ns!r}, 'DEF')",
                                             f"OpLibrary({env.ns!r}, 'DEF', closed=True)"))
    d = env.op_dist("frag", define("extra"), kind="FRAGMENT")
    return Fault({d}, absent=(env.op("extra"),), source=env.at(d, LIBRARY_LINE))


def autograd_on_mutable_op(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema="(Tensor(a!) x) -> ()", kernels="{}",
        extra=", mutates_args=['x'], autograd='KMOD:clone'"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def add_works() -> None:
    """``torch.add`` adds (a plugin that replaced it was undone)."""
    a = torch.arange(3.0)
    assert torch.equal(torch.add(a, a), a * 2), "aten::add is still replaced"


def replaces_torch_kernel_at_import(env: Env) -> Fault:
    """The plugin replaces aten::add's CPU kernel itself at import: undone, left out."""
    d = env.op_dist("sneaky", define("foo") + "import torch\n"
                    "_mine = torch.library.Library('aten', 'IMPL')\n"
                    "_mine.impl('add.Tensor', lambda a, b, alpha=1: a.sub(b), 'CPU')\n")

    def destroy() -> None:
        module = sys.modules.get(env.module_name(d))
        if module is not None:
            module._mine._destroy()

    env.request.addfinalizer(destroy)
    # torch records where the Library was made, not each impl call
    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 2),
                 says="undid it", unchanged=add_works)


def replaces_torch_kernel_through_older_library(env: Env) -> Fault:
    """Through a Library made before opregistry imported it: reported, cannot be undone."""
    helper = f"{env.ns}_older_lib"
    env.dists.root.joinpath(f"{helper}.py").write_text(
        "import torch\n_mine = torch.library.Library('aten', 'IMPL')\n")
    import importlib

    importlib.invalidate_caches()
    older = importlib.import_module(helper)  # imported before opregistry watches anything
    env.dists.modules.append(helper)
    env.request.addfinalizer(older._mine._destroy)
    d = env.op_dist("sneaky", define("foo") + f"from {helper} import _mine\n"
                    "_mine.impl('mul.Tensor', lambda a, b: a.sub(b), 'CPU')\n")
    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 2),
                 says="cannot undo it")


def edited_after_lock_in_locked_mode(env: Env) -> Fault:
    """Locked mode: a distribution edited after the lock is refused before it is imported."""
    d = env.op_dist("edited", define("foo") + "import pathlib\n"
                    "pathlib.Path(__file__).with_suffix('.imported').write_text('ran')\n")
    from opregistry.lockfile import write_lock

    lock = env.dists.root / "opregistry.lock"
    write_lock(plan(env.dists, plugins=scope(env)), lock)
    module = env.dists.root / f"{env.module_name(d)}.py"
    module.write_text(module.read_text() + "# edited after the lock\n")
    marker = module.with_suffix(".imported")
    marker.unlink()
    env.request.getfixturevalue("monkeypatch").setenv("OPREGISTRY_LOCK", str(lock))

    def unchanged() -> None:
        assert not marker.exists(), "the edited module was imported"

    return Fault({d}, absent=(env.op("foo"),), says=f"{module.name} changed", unchanged=unchanged,
                 entry_point=False)


def kernel_module_edited_after_lock_in_locked_mode(env: Env) -> Fault:
    """Locked mode: a kernel module of its own beside the package (no RECORD), edited after the
    lock: refused before anything of the distribution is imported."""
    d = env.op_dist("kedited", define("foo", kernels="{'cpu': 'NS_kedited:k'}"),
                    modules={"NS_kedited": "def k(x):\n    return x.clone()\n"})
    from opregistry.lockfile import write_lock

    lock = env.dists.root / "opregistry.lock"
    write_lock(plan(env.dists, plugins=scope(env)), lock)
    kernels = env.dists.root / f"{env.ns}_kedited.py"
    kernels.write_text(kernels.read_text().replace(
        "return x.clone()", "__import__('os').system('true'); return x.clone()"))
    env.request.getfixturevalue("monkeypatch").setenv("OPREGISTRY_LOCK", str(lock))
    declarations = env.module_name(d)
    sys.modules.pop(declarations)  # imported by the plan that was locked

    def unchanged() -> None:
        assert declarations not in sys.modules, "the declarations module was imported"
        assert f"{env.ns}_kedited" not in sys.modules, "the edited kernel module was imported"

    return Fault({d}, absent=(env.op("foo"),), says=f"{kernels.name} changed",
                 unchanged=unchanged, entry_point=False)


def declares_through_another_library(env: Env) -> Fault:
    """The plugin imports the bystander's module and declares through its OpLibrary."""
    victim = env.module_name("bystander")
    d = env.op_dist("bad", define("foo") + f"import {victim}\n"
                    f"{victim}.lib.define('evil(Tensor x) -> Tensor', "
                    f"kernels={{'cpu': '{env.kmod}:twice'}})\n")
    return Fault({d}, absent=(env.op("foo"), f"{env.ns}ok::evil"), source=env.at(d, BODY_LINE + 2),
                 says="through a library of bystander==1.0")


def hook_put_on_another_library(env: Env) -> Fault:
    """The plugin replaces the bystander's opregistry_ops with a function of its own."""
    victim = env.module_name("bystander")
    d = env.op_dist("bad", define("foo") + f"import {victim}\n"
                    f"def _nothing():\n    return []\n{victim}.lib.opregistry_ops = _nothing\n")
    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 2),
                 says="its own opregistry_ops() on it")


def rebinds_opregistry_at_import(env: Env) -> Fault:
    """``opregistry.OpLibrary = None`` at import: refused, the plugin named, the rest loads."""
    d = env.op_dist("bad", define("foo") + "import opregistry\nopregistry.OpLibrary = None\n")

    def unchanged() -> None:
        import opregistry.declare

        assert opregistry.OpLibrary is opregistry.declare.OpLibrary

    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 2),
                 says="changed opregistry's own state", unchanged=unchanged)


def kernel_module_rebinds_opregistry(env: Env) -> Fault:
    """A kernel module rebinds opregistry's tables when registration imports it: put back, its
    distribution rolled back."""
    d = env.op_dist("bad", define("foo", kernels="{'cpu': 'NS_rebinds:k'}"),
                    modules={"NS_rebinds": "import opregistry.keys\n"
                                           "opregistry.keys.DEVICE_KEYS = {}\n"
                                           "def k(x):\n    return x\n"})

    def unchanged() -> None:
        import opregistry.keys

        assert "CPU" in opregistry.keys.DEVICE_KEYS

    return Fault({d}, absent=(env.op("foo"),), source=f"{env.ns}_rebinds.py:2",
                 says="changed opregistry's own state", unchanged=unchanged, live=True)


def kernel_module_exits(env: Env) -> Fault:
    """A kernel module calls sys.exit(3) at import: left out, import torch goes on."""
    d = env.op_dist("exits", define("foo", kernels="{'cpu': 'NS_exits:k'}"),
                    modules={"NS_exits": "import sys\nsys.exit(3)\ndef k(x):\n    return x\n"})
    return Fault({d}, absent=(env.op("foo"),), source=f"{env.ns}_exits.py:2", says="SystemExit",
                 live=True)


def kernel_module_raises_base_exception(env: Env) -> Fault:
    """A custom BaseException from a kernel module: its distribution only, not the registry."""
    d = env.op_dist("boom", define("foo", kernels="{'cpu': 'NS_boom:k'}"),
                    modules={"NS_boom": "class Boom(BaseException):\n    pass\n"
                                        "raise Boom('no')\n"})
    return Fault({d}, absent=(env.op("foo"),), source=f"{env.ns}_boom.py:3", says="Boom: no",
                 live=True)


def declaration_raises_keyboard_interrupt(env: Env) -> Fault:
    """KeyboardInterrupt raised by plugin code (no Ctrl-C pressed) is the plugin's failure."""
    d = env.op_dist("interrupts", define("foo") + "raise KeyboardInterrupt\n")
    return Fault({d}, absent=(env.op("foo"),), source=env.at(d, BODY_LINE + 1),
                 says="KeyboardInterrupt")


def kernel_module_replaces_torch_kernel(env: Env) -> Fault:
    """A kernel module replaces aten::mul's CPU kernel when imported: undone, left out."""
    d = env.op_dist("sneakyk", define("foo", kernels="{'cpu': 'NS_sneakyk:k'}"),
                    modules={"NS_sneakyk": "import torch\n"
                             "_mine = torch.library.Library('aten', 'IMPL')\n"
                             "_mine.impl('mul.Tensor', lambda a, b: a.add(b), 'CPU')\n"
                             "def k(x):\n    return x\n"})

    def unchanged() -> None:
        a = torch.arange(3.0)
        assert torch.equal(torch.mul(a, a), a * a.clone()), "aten::mul is still replaced"
        assert torch.equal(torch.mul(a, 2.0), torch.tensor([0.0, 2.0, 4.0]))

    return Fault({d}, absent=(env.op("foo"),), source=f"{env.ns}_sneakyk.py:2",
                 says="undid it", unchanged=unchanged, live=True)


def kernel_module_replaces_another_distributions_kernel(env: Env) -> Fault:
    """A kernel module replaces the CPU kernel of another distribution's op: undone, left out."""
    victim = env.op_dist("victim", define("vop"), namespace=f"{env.ns}v")
    d = env.op_dist("hijack", define("foo", kernels="{'cpu': 'NS_hijack:k'}"),
                    modules={"NS_hijack": "import torch\n"
                             "_mine = torch.library.Library('NSv', 'IMPL')\n"
                             "_mine.impl('vop', lambda x: x * 100, 'CPU')\n"
                             "def k(x):\n    return x\n"})

    def unchanged() -> None:
        vop = getattr(torch.ops, f"{env.ns}v").vop
        assert torch.equal(vop(torch.arange(3.0)), torch.arange(3.0)), "the victim's kernel is back"

    assert victim
    return Fault({d}, absent=(env.op("foo"),), source=f"{env.ns}_hijack.py:2",
                 says="undid it", unchanged=unchanged, live=True)


def _installed_torch():  # type: ignore[no-untyped-def]
    from opregistry.keys import installed_torch

    facts = installed_torch()
    assert facts is not None
    return facts


def out_tag_without_mutable_argument(env: Env) -> Fault:
    # Library.define raises ValueError for this; the resolver says so first
    facts = _installed_torch()
    if "out" not in facts.tags:  # refused as op-tag-needs-newer-torch: tag-newer-than-installed-torch
        pytest.skip(f"torch.Tag.out needs torch {tag_since('out')}; this is {facts.version}")
    d = env.op_dist("bad", define("ok") + define("foo", extra=", tags=['out']"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="mutable argument")


def autograd_on_op_returning_nothing(env: Env) -> Fault:
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema="(Tensor x) -> ()", kernels="{}", extra=", autograd='KMOD:clone'"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1))


def schema_keyword_as_name(env: Env) -> Fault:
    # a valid Python identifier, but torch's schema lexer reserves it
    d = env.op_dist("bad", define("ok") + define("def"))
    return Fault({d}, absent=(env.op("ok"), env.op("def")), source=env.at(d, BODY_LINE + 1),
                 says="keyword")


def op_named_like_an_attribute(env: Env) -> Fault:
    # torch.ops.<ns>.name is the namespace's own name: Library.define fails inside torch
    d = env.op_dist("bad", define("ok") + define("name"))
    return Fault({d}, absent=(env.op("ok"), env.op("name")), source=env.at(d, BODY_LINE + 1),
                 says="attribute of torch's own")


def overload_torch_cannot_reach(env: Env) -> Fault:
    # torch.ops.<ns>.f.overloads is the packet's method: torch defines it, no one reaches it
    d = env.op_dist("bad", define("ok") + define("f.overloads"))
    return Fault({d}, absent=(env.op("ok"), env.op("f.overloads")),
                 source=env.at(d, BODY_LINE + 1), says="overload 'overloads', which torch.ops "
                                                      "cannot reach")


def type_torch_refuses_for_custom_ops(env: Env) -> Fault:
    # SymFloat: torch's schema parser of no supported release takes it
    d = env.op_dist("bad", define("ok") + define("foo", schema="(Tensor x, SymFloat d) -> Tensor"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="SymFloat")


def type_gone_from_installed_torch(env: Env) -> Fault:
    """A schema type an earlier release's parser took (Dimname, up to 2.8): refused before torch."""
    facts = _installed_torch()
    # gone from this release (PyObject, of 2.12 alone, is also lacking before 2.12: newer)
    lacking = [t for t in sorted(TYPE_UNTIL) if facts.release > TYPE_UNTIL[t]]
    if not lacking:
        pytest.skip(f"no schema type of the supported range is gone from torch {facts.version}: "
                    f"the fault exists on torch > {'%d.%d' % min(TYPE_UNTIL.values())}")
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema=f"(Tensor x, {lacking[0]} name) -> Tensor"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says=f"{lacking[0]} up to torch {type_until(lacking[0])}")


def custom_class_unknown(env: Env) -> Fault:
    """A custom class type nobody registered: torch would fail in the middle of registering."""
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema="(Tensor x, __torch__.torch.classes.nolib.Nothing c) -> Tensor"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says="__torch__.torch.classes.nolib.Nothing")


def tag_newer_than_installed_torch(env: Env) -> Fault:
    """A tag of a later release of the range: refused before torch, naming that release."""
    facts = _installed_torch()
    lacking = sorted(ALL_TAGS - facts.tags, key=lambda t: (TAG_SINCE.get(t, (0, 0)), t))
    if not lacking:
        pytest.skip(f"torch {facts.version} has every tag of the supported range: the fault "
                    f"exists on torch < {'%d.%d' % max(TAG_SINCE.values())} (CI's torch 2.8 pass)")
    tag = lacking[-1]
    d = env.op_dist("bad", define("ok") + define("foo", extra=f", tags=[{tag!r}]"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says=f"torch.Tag.{tag} exists from torch {tag_since(tag)}")


def type_newer_than_installed_torch(env: Env) -> Fault:
    """A schema type a later release's parser takes (SymBool): refused before torch."""
    facts = _installed_torch()
    # newer than this release (PyObject, of 2.12 alone, is also lacking after 2.12: gone)
    lacking = [t for t in sorted(TYPE_SINCE) if facts.release < TYPE_SINCE[t]]
    if not lacking:
        pytest.skip(f"no schema type of the supported range is newer than torch "
                    f"{facts.version}: the fault exists on torch < "
                    f"{'%d.%d' % max(TYPE_SINCE.values())} (CI's torch 2.8 pass)")
    d = env.op_dist("bad", define("ok") + define(
        "foo", schema=f"(Tensor x, {lacking[0]} flag) -> Tensor"))
    return Fault({d}, absent=(env.op("ok"), env.op("foo")), source=env.at(d, BODY_LINE + 1),
                 says=f"{lacking[0]} from torch {type_since(lacking[0])}")


def distribution_installed_twice(env: Env) -> Fault:
    env.op_dist("twin", define("foo"))
    d = env.op_dist("twin", define("bar"), version="2.0")
    return Fault({d}, absent=(env.op("foo"), env.op("bar")))


def entry_point_name_twice(env: Env) -> Fault:
    first, second = f"twice_a_{env.ns}", f"twice_b_{env.ns}"
    header = f"from opregistry import OpLibrary\nlib = OpLibrary({env.ns!r})\n"
    d = env.dists.make("twice", ops={"ops": f"{first}:lib"}, modules={
        first: header + define("foo").replace("KMOD", env.kmod),
        second: header.replace("OpLibrary(", "OpLibrary(kind='FRAGMENT', namespace=")
        + define("bar").replace("KMOD", env.kmod),
        env.kmod: KERNELS})
    info = next(env.dists.root.glob("twice-*.dist-info"))
    entry_points = info / "entry_points.txt"
    entry_points.write_text(entry_points.read_text() + f"ops = {second}:lib\n")
    return Fault({d}, absent=(env.op("foo"), env.op("bar")))


def one_bad_entry_point_of_two(env: Env) -> Fault:
    """Rule 9: the distribution's healthy entry point is left out with the broken one."""
    module = env.module_name("half")
    d = env.dists.make("half", ops={"good": f"{module}:lib", "broken": f"no_such_module_{env.ns}:lib"},
                       modules={module: f"from opregistry import OpLibrary\nlib = OpLibrary("
                                        f"{env.ns!r})\n" + define("foo").replace("KMOD", env.kmod),
                                env.kmod: KERNELS})
    return Fault({d}, absent=(env.op("foo"),))


#: case id -> (the Problem code it must produce, the builder)
def _native_dist(env: Env, dist: str, library: str, *, namespace: str | None = None,
                 body: str = "lib.define('twice(Tensor x) -> Tensor', native=['CPU'], "
                             "fake='KMOD:fake')\n") -> str:
    """``OpLibrary(ns, native=<library>)`` (Python source) on line 2, then ``body``."""
    namespace = env.ns if namespace is None else namespace
    module = env.module_name(dist)
    source = (f"from opregistry import OpLibrary, NativeLibrary\n"
              f"lib = OpLibrary({namespace!r}, native={library})\n"
              + body.replace("KMOD", env.kmod))
    return env.dists.make(dist, ops={"ops": f"{module}:lib"},
                          modules={module: source, env.kmod: KERNELS})


def native_library_missing(env: Env) -> Fault:
    missing = Path(env.dists.root) / "gone" / "_C.so"
    d = _native_dist(env, "bad", f"NativeLibrary(path={str(missing)!r})")
    return Fault({d}, absent=(env.op("twice"),), source=env.at(d, LIBRARY_LINE),
                 says="does not exist")


def native_built_for_other_torch(env: Env) -> Fault:
    d = _native_dist(env, "bad", f"NativeLibrary(path={torch._C.__file__!r}, torch='2.0.1')")
    return Fault({d}, absent=(env.op("twice"),), source=env.at(d, LIBRARY_LINE),
                 says="was built for torch 2.0.1")


def native_fails_to_load(env: Env) -> Fault:
    junk = Path(env.dists.root) / "junk.so"
    junk.write_text("not a shared library\n")
    d = _native_dist(env, "bad", f"NativeLibrary(path={str(junk)!r})")
    return Fault({d}, absent=(env.op("twice"),), says="junk.so", live=True)


def native_undeclared_op(env: Env) -> Fault:
    """The library's TORCH_LIBRARY defines an op the declaration lacks (tests/native_build.py)."""
    from .native_build import NS

    library = env.request.getfixturevalue("native_test_library")
    d = _native_dist(env, "bad", f"NativeLibrary(path={str(library)!r})", namespace=NS)
    return Fault({d}, says=f"{NS}::hidden", live=True,
                 foreign=(f"{NS}::twice", f"{NS}::hidden"))


def native_replaces_kernel(env: Env) -> Fault:
    """The library's TORCH_LIBRARY_IMPL replaces a kernel torch already has (another package's).

    ``SWAP_OWN`` of tests/native_build.py replaces ``twice``'s CPU kernel by one that
    computes the same (harmless here; test_native.py replaces aten::add.Tensor's in a
    child process).  A copy per case, so that each load runs its static initializers.
    """
    import shutil

    from .native_build import NS

    torch.ops.load_library(str(env.request.getfixturevalue("native_test_library")))
    library = Path(env.dists.root) / "swap_own.so"
    shutil.copy(env.request.getfixturevalue("native_libraries")["swap_own"], library)
    d = _native_dist(env, "bad", f"NativeLibrary(path={str(library)!r})",
                     body="lib.define('own(Tensor x) -> Tensor')\n")
    return Fault({d}, says=f"replaced the kernel torch already had for {NS}::twice (CPU, "
                           "registered at ", live=True)


def _native_impl_dist(env: Env, dist: str, namespace: str, body: str) -> str:
    """``OpLibrary(namespace, 'IMPL', native=<a copy of tests/native_build.py's IMPL>)`` on
    line 2 (never loaded: every case refuses it first), then ``body``."""
    import shutil

    library = Path(env.dists.root) / f"{dist}_impl.so"
    shutil.copy(env.request.getfixturevalue("native_libraries")["impl"], library)
    module = env.module_name(dist)
    source = (f"from opregistry import OpLibrary, NativeLibrary\n"
              f"lib = OpLibrary({namespace!r}, 'IMPL', native=NativeLibrary("
              f"path={str(library)!r}))\n" + body)
    return env.dists.make(dist, ops={"ops": f"{module}:lib"}, modules={module: source})


def native_impl_kernel_overridden(env: Env) -> Fault:
    """An IMPL library's C++ CPU kernel that a Python override displaces: its library would
    register it all the same, so it is refused before loading."""
    env.request.getfixturevalue("monkeypatch").setenv("OPREGISTRY_ALLOW_OVERRIDE", env.ns)
    env.op_dist("owner", define("twice", kernels="{}", extra=", fake='KMOD:fake'"))
    d = _native_impl_dist(env, "bad", env.ns, "lib.impl('twice', native=['CPU'])\n")
    env.op_dist("over", "lib.impl('twice', 'cpu', 'KMOD:clone', override=True)\n", kind="IMPL")
    return Fault({d}, source=env.at(d, BODY_LINE), says="would not serve (overridden")


def native_impl_for_torch_op(env: Env) -> Fault:
    """An IMPL library's C++ kernel for an aten op: refused whatever the policy."""
    env.request.getfixturevalue("monkeypatch").setenv("OPREGISTRY_ALLOW_OVERRIDE", "aten")
    d = _native_impl_dist(env, "bad", "aten",
                          "lib.impl('add.Tensor', native=['CPU'], override=True)\n")

    def unchanged() -> None:
        assert torch.equal(torch.ones(2) + torch.ones(2), torch.full((2,), 2.0))

    return Fault({d}, source=env.at(d, BODY_LINE), unchanged=unchanged, says="an op torch owns")


CASES: dict[str, tuple[str, Callable[[Env], Fault]]] = {
    "malformed-schema": ("schema-invalid", malformed_schema),
    "unknown-type": ("schema-invalid", unknown_type),
    "duplicate-argument-names": ("schema-invalid", duplicate_argument_names),
    "alias-disagrees-with-mutates-args": ("schema-invalid", alias_disagrees_with_mutates_args),
    "missing-module": ("plugin-missing-module", missing_module),
    "missing-attribute": ("plugin-missing-attribute", missing_attribute),
    "import-raises": ("plugin-import-error", import_raises),
    "hookimpl-raises": ("plugin-hook-error", hookimpl_raises),
    "hookimpl-wrong-argument": ("plugin-invalid", hookimpl_wrong_argument),
    "two-def-of-one-namespace": ("namespace-conflict", two_def_of_one_namespace),
    "fragment-redefines-op": ("op-conflict", fragment_redefines_op),
    "def-aten": ("namespace-reserved", _def_of("aten")),
    "def-prims": ("namespace-reserved", _def_of("prims")),
    "def-quantized-cpp": ("namespace-reserved", _def_of("quantized")),
    "def-namespace-held-outside": ("namespace-held-by-torch", def_of_namespace_held_outside),
    "two-kernels-for-one-key": ("kernel-conflict", two_kernels_for_one_key),
    "kernel-for-undefined-op": ("kernel-for-undefined-op", kernel_for_undefined_op),
    "composite-implicit-beside-device-kernel": ("composite-implicit-mixed",
                                                composite_implicit_beside_device_kernel),
    "composite-implicit-with-fake": ("composite-implicit-mixed", composite_implicit_with_fake),
    "unknown-dispatch-key": ("declaration-invalid", unknown_dispatch_key),
    "misspelt-dispatch-key": ("declaration-invalid", misspelt_dispatch_key),
    "bad-condition-spec": ("declaration-invalid", bad_condition_spec),
    "condition-on-torch-op": ("kernel-condition-unsupported", condition_on_torch_op),
    "aten-add-without-policy": ("kernel-torch-op-denied", aten_add_without_policy),
    "override-without-policy": ("kernel-override-denied", override_without_policy),
    "fake-registered-twice": ("kernel-duplicate", fake_registered_twice),
    "namespace-empty": ("namespace-invalid", _namespace("")),
    "namespace-dash": ("namespace-invalid", _namespace("my-ns")),
    "namespace-non-ascii": ("namespace-invalid", _namespace("ñs")),
    "namespace-leading-digit": ("namespace-invalid", _namespace("1abc")),
    "namespace-dot": ("namespace-invalid", _namespace("a.b")),
    "namespace-underscore": ("namespace-reserved", _namespace("_")),
    "namespace-torch-ops-attribute": ("namespace-invalid", _namespace("load_library")),
    "op-named-like-a-namespace-attribute": ("op-name-invalid", op_named_like_an_attribute),
    "overload-torch-cannot-reach": ("op-name-invalid", overload_torch_cannot_reach),
    "kernel-ref-unresolvable": ("materialize-failed", kernel_ref_unresolvable),
    "kernel-ref-not-callable": ("materialize-failed", kernel_ref_not_callable),
    "torch-rejects-halfway": ("materialize-failed", torch_rejects_halfway),
    "rollback-takes-dependents": ("materialize-dependency-failed", rollback_takes_dependents),
    "registers-with-torch-at-import": ("plugin-registered-outside-plan",
                                       registers_with_torch_at_import),
    "replaces-torch-kernel-through-older-library": ("plugin-replaced-torch-kernel",
                                                    replaces_torch_kernel_through_older_library),
    "kernel-module-exits": ("materialize-failed", kernel_module_exits),
    "edited-after-lock-in-locked-mode": ("lock-mismatch", edited_after_lock_in_locked_mode),
    "kernel-module-edited-after-lock-in-locked-mode": (
        "lock-mismatch", kernel_module_edited_after_lock_in_locked_mode),
    "kernel-module-raises-base-exception": ("materialize-failed",
                                            kernel_module_raises_base_exception),
    "declaration-raises-keyboard-interrupt": ("plugin-import-error",
                                              declaration_raises_keyboard_interrupt),
    "kernel-module-replaces-torch-kernel": ("plugin-registered-outside-plan",
                                            kernel_module_replaces_torch_kernel),
    "kernel-module-replaces-another-distributions-kernel": (
        "plugin-registered-outside-plan", kernel_module_replaces_another_distributions_kernel),
    "plugin-calls-load-at-import": ("plugin-import-error", plugin_calls_load_at_import),
    "declares-through-another-library": ("declaration-not-owned",
                                         declares_through_another_library),
    "hook-put-on-another-library": ("declaration-not-owned", hook_put_on_another_library),
    "rebinds-opregistry-at-import": ("opregistry-state-changed", rebinds_opregistry_at_import),
    "kernel-module-rebinds-opregistry": ("opregistry-state-changed",
                                         kernel_module_rebinds_opregistry),
    "replaces-torch-kernel-at-import": ("plugin-registered-outside-plan",
                                        replaces_torch_kernel_at_import),
    "hookimpl-returns-wrong-type": ("plugin-invalid", hookimpl_returns_wrong_type),
    "unknown-hook-name": ("plugin-invalid", unknown_hook_name),
    "hook-in-wrong-group": ("plugin-invalid", hook_in_wrong_group),
    "unknown-tag": ("op-tag-unknown", unknown_tag),
    "fragment-of-closed-namespace": ("namespace-closed", fragment_of_closed_namespace),
    "autograd-on-mutable-op": ("autograd-on-mutable-op", autograd_on_mutable_op),
    "vmap-kwarg-only-tensor": ("vmap-kwarg-only-tensor", vmap_kwarg_only_tensor),
    "out-tag-without-mutable-argument": ("schema-invalid", out_tag_without_mutable_argument),
    "tag-newer-than-installed-torch": ("op-tag-needs-newer-torch", tag_newer_than_installed_torch),
    "type-newer-than-installed-torch": ("schema-type-needs-newer-torch",
                                        type_newer_than_installed_torch),
    "autograd-on-op-returning-nothing": ("autograd-no-returns", autograd_on_op_returning_nothing),
    "schema-keyword-as-name": ("op-name-invalid", schema_keyword_as_name),
    "type-torch-refuses-for-custom-ops": ("schema-invalid", type_torch_refuses_for_custom_ops),
    "type-gone-from-installed-torch": ("schema-type-gone-from-torch",
                                       type_gone_from_installed_torch),
    "custom-class-unknown": ("schema-class-unknown", custom_class_unknown),
    "distribution-installed-twice": ("distribution-duplicate", distribution_installed_twice),
    "entry-point-name-twice": ("entry-point-duplicate", entry_point_name_twice),
    "one-bad-entry-point-of-two": ("plugin-missing-module", one_bad_entry_point_of_two),
    "autocast-unknown-device-type": ("declaration-invalid", autocast_unknown_device_type),
    "autocast-kwarg-only-argument": ("autocast-kwarg-only-argument", autocast_kwarg_only_argument),
    "autocast-on-mutable-op": ("autocast-on-mutable-op", autocast_on_mutable_op),
    "torch-dispatch-rule-module-missing": ("materialize-failed", torch_dispatch_rule_module_missing),
    "torch-dispatch-class-not-a-mode": ("materialize-failed", torch_dispatch_class_not_a_mode),
    "triton-kernels-from-two-distributions": ("triton-split",
                                              triton_kernels_from_two_distributions),
    "native-library-missing": ("native-library-missing", native_library_missing),
    "native-built-for-other-torch": ("native-torch-mismatch", native_built_for_other_torch),
    "native-fails-to-load": ("native-load-failed", native_fails_to_load),
    "native-undeclared-op": ("native-undeclared-registration", native_undeclared_op),
    "native-replaces-kernel": ("native-undeclared-registration", native_replaces_kernel),
    "native-impl-kernel-overridden": ("native-kernel-displaced", native_impl_kernel_overridden),
    "native-impl-for-torch-op": ("native-kernel-foreign", native_impl_for_torch_op),
}


# -- the generic checks ---------------------------------------------------------


#: the backends the cases need; the others are left out so that a fault
#: elsewhere in the environment cannot change what strict mode sees
BACKENDS = ("opregistry-cpu", "opregistry-meta", "opregistry-autocast", "opregistry-torch-dispatch")


def scope(env: Env) -> list[str]:
    return [*BACKENDS, *env.dists.names]


def bystander(env: Env) -> str:
    """A healthy distribution in its own namespace, which must load in default mode."""
    return env.op_dist("bystander", define("fine", extra=", fake='KMOD:fake'"),
                       namespace=f"{env.ns}ok")


@pytest.fixture
def env(dists: DistFactory, ns: str, request: pytest.FixtureRequest) -> Env:
    return Env(dists, ns, request)


def build(env: Env, case: str) -> tuple[str, Fault]:
    code, builder = CASES[case]
    bystander(env)
    return code, builder(env)


#: problem code -> the opregistry error carried by ``Problem.error``
TYPED_ERRORS: dict[str, type[BaseException]] = {
    "plugin-missing-module": opregistry.PluginLoadError,
    "plugin-missing-attribute": opregistry.PluginLoadError,
    "plugin-import-error": opregistry.PluginLoadError,
    "plugin-hook-error": opregistry.PluginLoadError,
    "plugin-invalid": opregistry.PluginValidationError,
    "declaration-invalid": opregistry.PluginLoadError,
    "materialize-failed": opregistry.MaterializationError,
}


def the_problem(problems: tuple[Problem, ...] | list[Problem], code: str, fault: Fault) -> Problem:
    found = [p for p in problems if p.code == code]
    assert found, f"no {code} problem among {[str(p) for p in problems]}"
    [problem] = [p for p in found if {o.distribution for o in p.culprits} == fault.culprits] or found
    assert {o.distribution for o in problem.culprits} == fault.culprits
    for origin in problem.culprits:
        assert origin.dist in problem.message, f"{origin.dist} not named in {problem.message!r}"
        if fault.entry_point:
            assert origin.entry_point and origin.value, "the entry point is named"
            assert origin.entry_point_spec in problem.to_dict()["entry_points"]
    assert fault.says in problem.message
    if fault.source is not None:
        assert problem.source is not None and problem.source.endswith("/" + fault.source), (
            f"{problem.source!r} does not point at {fault.source}")
    assert problem.hint, "every problem says what to do"
    typed = TYPED_ERRORS.get(problem.code)
    if typed is not None:
        # the exception behind it, as our own type, with the original as its cause
        assert isinstance(problem.error, typed), problem.error
        assert problem.error.distribution in {o.dist for o in problem.culprits}
        # our own checks (an unknown hook name) have no exception behind them
        assert problem.error.__cause__ is not None or problem.code == "plugin-invalid"
    return problem


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_mode_leaves_the_distribution_out(env: Env, case: str) -> None:
    """Default mode: the faulty distribution is left out whole; the rest loads."""
    code, fault = build(env, case)
    reg = load(env.dists, plugins=scope(env))
    the_problem(reg.errors, code, fault)
    ops = all_ops()
    for qualname in fault.absent:
        assert qualname not in ops, f"{qualname} of a faulty distribution is in torch"
    assert not {op.op.origin.distribution for op in reg.ops} & fault.culprits
    assert not {k.kernel.origin.distribution for k in reg.kernels if k.status == "active"
                } & fault.culprits
    if fault.unchanged is not None:
        fault.unchanged()
    fine = getattr(getattr(torch.ops, f"{env.ns}ok"), "fine")
    assert torch.equal(fine(torch.arange(3.0)), torch.arange(3.0)), "the bystander loads"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{env.ns}ok::fine", "CPU")


@pytest.mark.parametrize("case", sorted(CASES))
def test_strict_mode_raises_and_registers_nothing(env: Env, case: str) -> None:
    """Strict mode: ResolutionError naming the problem; not even the bystander is registered."""
    code, fault = build(env, case)
    before = all_ops()
    with pytest.raises(ResolutionError) as info:
        load(env.dists, strict=True, plugins=scope(env))
    problem = the_problem(info.value.problems, code, fault)
    assert info.value.distribution is not None
    if problem is info.value.problems[0] and problem.error is not None:
        assert info.value.__cause__ is problem.error, "the traceback shows the real cause"
    assert all_ops() - before <= set(fault.foreign), "strict mode leaves torch's dispatcher as it was"
    assert opregistry.get_registry() is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_reported_by_doctor(env: Env, case: str, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``opregistry doctor --json`` reports the case, names the distribution, exits 1."""
    from opregistry.cli import main

    code, fault = build(env, case)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(scope(env)))
    # registration failures and namespaces held by torch need torch: doctor --live
    live = code.startswith("materialize") or code == "namespace-held-by-torch" or fault.live
    rc = main(["doctor", "--json", *(["--live"] if live else [])])
    report = json.loads(capsys.readouterr().out)
    assert rc != 0
    found = [f for f in report["problems"] if f["code"] == code]
    assert found, f"doctor did not report {code}: {report}"
    expected = {f"{d}==" for d in fault.culprits}
    assert any({x["name"] + "==" for x in f["distributions"]} == expected for f in found)
    if fault.source is not None:
        assert any((f["source"] or "").endswith("/" + fault.source) for f in found)


#: in a fresh interpreter: the distributions left out by plain ``opregistry doctor``
#: (``{"left_out": [...], "torch": whether doctor imported torch}``), by ``doctor --live``,
#: or by ``import torch``
_VERDICT = {
    "doctor": """
import contextlib, io, json, sys
from opregistry.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["doctor", "--json", *sys.argv[1:]])
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


def fresh_verdict(env: Env, how: str, *argv: str) -> list[str]:
    """What a fresh interpreter decides for the case's distributions (see :data:`_VERDICT`)."""
    import os
    import subprocess

    environ = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    environ.update(OPREGISTRY_PLUGINS=",".join(scope(env)), PYTHONPATH=os.pathsep.join(
        filter(None, [str(env.dists.root), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _VERDICT[how], *argv], capture_output=True,
                          text=True, env=environ, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: cases whose fault shows only when code runs at registration -- a kernel module's import
#: (sys.exit, a BaseException, a Library of its own), a backend hook that torch refuses, what
#: a native library registers when loaded: ``doctor`` without torch cannot know it without
#: running that code (``--live`` does, and is compared instead); each is checked to really
#: differ, so that a case doctor learns to see leaves this set
FOUND_BY_REGISTRATION: frozenset[str] = frozenset({
    "kernel-module-replaces-torch-kernel",
    "kernel-module-replaces-another-distributions-kernel", "torch-rejects-halfway",
    "native-undeclared-op", "native-replaces-kernel", "kernel-module-rebinds-opregistry",
})


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_doctor_and_import_torch_agree(env: Env, case: str) -> None:
    """Each case, in fresh interpreters: plain ``opregistry doctor`` (no torch) leaves out the
    distributions a fresh ``import torch`` leaves out -- no more, no fewer."""
    build(env, case)
    imported = fresh_verdict(env, "import torch")
    doctor = fresh_verdict(env, "doctor")
    if case in FOUND_BY_REGISTRATION:
        assert doctor != imported, f"doctor now sees {case}: remove it from FOUND_BY_REGISTRATION"
        assert fresh_verdict(env, "doctor", "--live") == imported
    else:
        assert doctor == imported, f"doctor: {doctor}, import torch: {imported}"


def test_same_entry_point_name_in_two_distributions_is_not_a_fault(env: Env) -> None:
    """Entry-point names are per distribution: everyone may call theirs ``ops``."""
    a = env.op_dist("first", define("foo"))
    b = env.op_dist("second", define("bar"), namespace=f"{env.ns}b")
    reg = load(env.dists, plugins=scope(env))
    assert not reg.errors
    assert {o.entry_point for o in reg.plan.distributions if o.distribution in (a, b)} == {"ops"}
    assert {env.op("foo"), f"{env.ns}b::bar"} <= all_ops()


# -- faults of the settings: not a distribution's, so each case checks its own way ------------
#
# Each case still runs every way that applies: load() (default and strict), the
# CLI / doctor, and -- where it is about `import torch` -- a fresh interpreter.

ACCEPTED = "use 1/0, true/false, yes/no or on/off"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from opregistry.cli import main

    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _clean_env(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(extra)
    return env




def strict_at_import_torch(env: Env, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """OPREGISTRY_STRICT=1 means at `import torch` what it means in load()."""
    import os
    import subprocess

    [bad] = missing_module(env).culprits
    out = subprocess.run(
        [sys.executable, "-c", STRICT_IMPORT_PROBE, f"{env.ns}ok::fine"], capture_output=True,
        text=True, timeout=120,
        env=_clean_env(OPREGISTRY_STRICT="1", OPREGISTRY_PLUGINS=",".join(scope(env)),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(env.dists.root),
                                                                os.environ.get("PYTHONPATH")]))))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["cause"] == "ResolutionError", (result, out.stderr[-2000:])
    assert "plugin-missing-module" in result["codes"] and f"{bad}==1.0" in result["message"]
    assert not result["present"][f"{env.ns}ok::fine"], (
        "strict: nothing is registered, not even the bystander")


def second_backend_for_a_key(env: Env, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """Another backend for CPU: opregistry-cpu keeps CPU, the bystander's kernel runs."""
    module = env.module_name("rival")
    env.dists.make("rival", backends={"cpu": f"{module}:backend"}, modules={module: (
        "from opregistry.backend import DeviceBackend\n"
        "backend = DeviceBackend('rivalcpu', key='CPU')\n")})
    reg = load(env.dists, plugins=scope(env))
    assert not reg.errors, [str(p) for p in reg.errors]
    [warning] = [p for p in reg.problems if p.code == "backend-shadowed"]
    assert "opregistry-cpu==" in warning.message and "rival==1.0" in warning.message
    assert "OPREGISTRY_BACKEND_CPU=rival" in warning.hint
    fine = getattr(getattr(torch.ops, f"{env.ns}ok"), "fine")
    assert torch.equal(fine(torch.arange(3.0)), torch.arange(3.0))
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{env.ns}ok::fine", "CPU")
    load(env.dists, strict=True, plugins=scope(env))  # a warning: strict mode loads too


def allow_list_names_missing_distribution(env: Env, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """OPREGISTRY_PLUGINS with a typo: an error naming the variable, with did-you-mean."""
    names = [n + "x" if n == "bystander" else n for n in scope(env)]
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(names))
    reg = opregistry.load(reload=True)
    [problem] = [p for p in reg.errors if p.code == "config-unknown-distribution"]
    assert problem.message.startswith("OPREGISTRY_PLUGINS names 'bystanderx'")
    assert "did you mean 'bystander'?" in problem.message
    with pytest.raises(ResolutionError, match="config-unknown-distribution"):
        opregistry.load(strict=True, reload=True)
    rc, out, _ = _cli(capsys, "doctor", "--json")
    assert rc == 1 and "config-unknown-distribution" in out


def _config_fault(variable: str, value: str | None, says: str) -> Callable[..., None]:
    """A value ``Settings`` refuses: ConfigError; CLI status 2; doctor's error; import torch logs."""
    def case(env: Env, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> None:
        from structlog.testing import capture_logs

        from opregistry.autoload import autoload

        setting = value
        if variable == "OPREGISTRY_CONFIG":
            path = Path(env.dists.root) / "opregistry.toml"
            if value is not None:
                path.write_text(value)
            setting = str(path)
        monkeypatch.setenv(variable, setting)
        expected = says.format(path=setting)
        with pytest.raises(opregistry.ConfigError) as info:
            load(env.dists, plugins=scope(env))
        assert str(info.value).startswith(expected), str(info.value)
        rc, out, err = _cli(capsys, "list")
        assert (rc, out) == (2, "") and err.splitlines() == [f"opregistry: {info.value}"]
        rc, out, err = _cli(capsys, "doctor", "--json")
        [finding] = json.loads(out)["problems"]
        assert rc == 1 and finding["code"] == "config-invalid"
        with capture_logs() as logs:
            autoload()  # what `import torch` runs: logs, registers nothing, raises nothing
        assert any(expected in str(entry.get("error")) for entry in logs), logs
        assert opregistry.get_registry() is None
    return case


def unknown_variable(env: Env, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    """OPREGISTRY_STICT=1: nothing reads it; a warning says which variable was meant."""
    monkeypatch.setenv("OPREGISTRY_STICT", "1")
    reg = load(env.dists, plugins=scope(env))
    [warning] = [p for p in reg.problems if p.code == "config-unknown-variable"]
    assert warning.severity == "warning"
    assert "did you mean 'OPREGISTRY_STRICT'?" in warning.message


def kernel_switch_unknown_target(env: Env, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """OPREGISTRY_KERNELS=-ns::fin (a typo): an error with a "did you mean"; nothing left out."""
    monkeypatch.setenv("OPREGISTRY_KERNELS", f"-{env.ns}ok::fin")
    reg = load(env.dists, plugins=scope(env))
    [problem] = [p for p in reg.errors if p.code == "kernel-switch-unknown"]
    assert f"did you mean '{env.ns}ok::fine'?" in problem.message
    assert "OPREGISTRY_KERNELS" in problem.message and not problem.culprits
    assert f"{env.ns}ok::fine" in reg.op_names, "the op still loads, with its kernels"
    with pytest.raises(ResolutionError):
        load(env.dists, plugins=scope(env), strict=True)


def schema_of_100k_characters(env: Env, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """The text of a problem is bounded; the data (to_dict, --json) keeps it whole."""
    args = ", ".join(f"Tensor a{i}" for i in range(8000))
    bad = env.op_dist("bad", define("huge", schema=f"({args}, Tensr z) -> Tensor"))
    reg = load(env.dists, plugins=scope(env))
    [problem] = [p for p in reg.errors if p.code == "schema-invalid"]
    assert len(problem.message) > 100_000, "the message itself stays whole"
    assert len(str(problem)) < 2_000 and "characters elided" in str(problem)
    assert f"{bad}==1.0" in str(problem), "the head, which names the distribution, is kept"
    with pytest.raises(ResolutionError) as info:
        load(env.dists, strict=True, plugins=scope(env))
    assert len(str(info.value)) < 3_000
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(scope(env)))
    rc, out, _ = _cli(capsys, "doctor", "--json")
    [finding] = [f for f in json.loads(out)["problems"] if f["code"] == "schema-invalid"]
    assert finding["message"] == problem.message


#: case id -> (the Problem code, the check); ``config-invalid`` is the code doctor
#: reports for a :class:`~opregistry.ConfigError`
def triton_not_installed(env: Env, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    """A Triton kernel without triton installed: that kernel is inactive, naming the
    requirement; the package loads with its other kernels (declared as a plain kernel, the
    module's ``import triton`` fails the whole distribution at registration)."""
    d = env.op_dist("tritonpkg", define("foo", kernels="{}", extra=", triton={'cpu': 'KMOD:twice'}, "
                                        "fake='KMOD:fake'") + define("bar"))
    monkeypatch.setitem(sys.modules, "triton", None)  # importlib's find_spec: not installed
    reg = load(env.dists, plugins=scope(env))
    [warning] = [p for p in reg.problems if p.code == "triton-missing"]
    assert f"{d}==1.0" in warning.message and "pip install triton" in warning.hint
    [cpu] = [k for k in reg.op(env.op("foo")).kernels if k.kernel.key == "CPU"]
    assert cpu.status == "inactive" and "triton" in cpu.reason
    bar = getattr(getattr(torch.ops, env.ns), "bar")
    assert torch.equal(bar(torch.arange(3.0)), torch.arange(3.0))  # the rest of it loads
    rc, out, _ = _cli(capsys, "doctor", "--json")
    assert "triton-missing" in out


SETTING_CASES: dict[str, tuple[str, Callable[..., None]]] = {
    "strict-at-import-torch": ("plugin-missing-module", strict_at_import_torch),
    "second-backend-for-a-key": ("backend-shadowed", second_backend_for_a_key),
    "allow-list-names-missing-distribution": ("config-unknown-distribution",
                                              allow_list_names_missing_distribution),
    "strict-not-a-boolean": ("config-invalid", _config_fault(
        "OPREGISTRY_STRICT", "ture", f"OPREGISTRY_STRICT='ture' is not a boolean: {ACCEPTED}")),
    "autoload-not-a-boolean": ("config-invalid", _config_fault(
        "OPREGISTRY_AUTOLOAD", "garbage",
        f"OPREGISTRY_AUTOLOAD='garbage' is not a boolean: {ACCEPTED}")),
    "config-file-missing": ("config-invalid", _config_fault(
        "OPREGISTRY_CONFIG", None, "OPREGISTRY_CONFIG={path}: cannot read the file")),
    "config-file-malformed": ("config-invalid", _config_fault(
        "OPREGISTRY_CONFIG", "plugins = [\n", "OPREGISTRY_CONFIG={path}: not valid TOML")),
    "unknown-variable": ("config-unknown-variable", unknown_variable),
    "kernel-switch-syntax": ("config-invalid", _config_fault(
        "OPREGISTRY_KERNELS", "rms_norm",
        "OPREGISTRY_KERNELS: 'rms_norm' must start with '-' (disable) or '+' (enable)")),
    "kernel-counts-not-a-boolean": ("config-invalid", _config_fault(
        "OPREGISTRY_KERNEL_COUNTS", "sure",
        f"OPREGISTRY_KERNEL_COUNTS='sure' is not a boolean: {ACCEPTED}")),
    "cache-not-a-boolean": ("config-invalid", _config_fault(
        "OPREGISTRY_CACHE", "maybe", f"OPREGISTRY_CACHE='maybe' is not a boolean: {ACCEPTED}")),
    "cache-check-not-a-mode": ("config-invalid", _config_fault(
        "OPREGISTRY_CACHE_CHECK", "contents",
        "OPREGISTRY_CACHE_CHECK='contents' is not a check mode: use 'stat' (size and "
        "modification time, the default) or 'content'")),
    "kernel-switch-unknown-target": ("kernel-switch-unknown", kernel_switch_unknown_target),
    "schema-of-100k-characters": ("schema-invalid", schema_of_100k_characters),
    "triton-not-installed": ("triton-missing", triton_not_installed),
}


@pytest.mark.parametrize("case", sorted(SETTING_CASES))
def test_setting_fault(env: Env, case: str, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    """A fault of the settings: said in one line naming the variable or file; nothing lost."""
    bystander(env)
    SETTING_CASES[case][1](env, monkeypatch, capsys)


# -- docs/reliability.md is this matrix ------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"


def doc_table() -> dict[str, str]:
    """case id -> problem code, from the table between the fault-matrix markers."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split("<!-- fault-matrix:start -->", 1)[1].split("<!-- fault-matrix:end -->", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z0-9-]+)`", cells[0]) if cells else None
        if match:
            [code] = re.findall(r"`([a-z-]+)`", cells[2])
            rows[match.group(1)] = code
    return rows


def test_docs_table() -> None:
    """Every case is in docs/reliability.md with its code, and every row is a case."""
    table = doc_table()
    cases = {**CASES, **SETTING_CASES}
    assert set(table) == set(cases), (
        f"missing from the docs: {sorted(set(cases) - set(table))}; "
        f"not a test: {sorted(set(table) - set(cases))}")
    assert table == {case: code for case, (code, _) in cases.items()}


def test_docs_config_example_is_valid(tmp_path: Path) -> None:
    """The TOML examples in docs/reliability.md are files opregistry accepts."""
    from opregistry.config import read_config

    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.toml"
        path.write_text(block)
        assert read_config(path)


def test_wrong_hookimpl_argument_wraps_pluggys_error(env: Env) -> None:
    """pluggy's PluginValidationError becomes ours, naming the distribution and the hook."""
    import pluggy

    d = env.raw_dist("bad", "def opregistry_ops(nope):\n    return []\n")
    [problem] = [p for p in plan(env.dists, plugins=scope(env)).errors if p.code == "plugin-invalid"]
    error = problem.error
    assert isinstance(error, opregistry.PluginValidationError) and isinstance(error, TypeError)
    assert isinstance(error.__cause__, pluggy.PluginValidationError)
    assert error.distribution == f"{d}==1.0" and error.entry_point == f"ops = {env.module_name(d)}"
    assert "opregistry_ops" in str(error) and "nope" in str(error)
