"""The start-up shortcuts give exactly what the paths they replace gave.

Each shortcut (docs/performance.md, "Start-up") skips work per op at
``import torch``; these tests compare its result with the long way, and
check that errors still come out as before.  No timing here: benchmarks/.
"""

from __future__ import annotations

import attrs
import pytest

import opregistry
from opregistry import schema
from opregistry.collect import _stamped
from opregistry.errors import SchemaError
from opregistry.model import Backend, Kernel, Namespace, OpDef, Origin

from .conftest import DistFactory, load, op_dist

ORIGIN = Origin("dist-a", "1.0", "opregistry.ops", "ep", "mod:lib")
RECORDS = [
    Namespace(name="nsx", kind="FRAGMENT"),
    OpDef(namespace="nsx", name="f", schema="(Tensor x) -> Tensor", tags=("pt2_compliant_tag",),
          source="mod.py:3"),
    Kernel(op="nsx::f", key="autograd", fn="mod:bwd", setup_context="mod:setup", override=True,
           source="mod.py:4"),
    Backend(name="b", keys=("CPU",), description="d"),
]


OTHER = Origin("dist-b", "2.0", "opregistry.ops", "ep2", "mod2:lib")


def _same_as_evolve(stamped: object, record: object, origin: Origin) -> None:
    evolved = attrs.evolve(record, origin=origin)
    assert type(stamped) is type(evolved)
    for field in attrs.fields(type(record)):
        assert getattr(stamped, field.name) == getattr(evolved, field.name), field.name
    assert stamped == evolved and hash(stamped) == hash(evolved)
    assert stamped.origin is origin
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stamped.origin = None  # type: ignore[misc]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_stamped_is_evolve(record: object) -> None:
    record = attrs.evolve(record)  # a fresh, unclaimed copy: _stamped may write to it
    hashed = hash(record)  # origin takes no part in equality: a set holding it stays valid
    stamped = _stamped(record, ORIGIN)
    _same_as_evolve(stamped, record, ORIGIN)
    assert stamped is record and hash(stamped) == hashed  # unclaimed: stamped in place
    assert _stamped(stamped, ORIGIN) is stamped  # collected again (reload): as it is
    # claimed by another distribution first: a copy, and the first keeps its origin
    other = _stamped(stamped, OTHER)
    _same_as_evolve(other, record, OTHER)
    assert other is not stamped and stamped.origin is ORIGIN


def test_a_record_two_distributions_return_is_attributed_to_each(
        dists: DistFactory, ns: str) -> None:
    """One module-level list of records returned by two entry points: each keeps its origin."""
    shared = (
        "from opregistry import Namespace, OpDef\n"
        f"NS = [Namespace(name='{ns}', kind='FRAGMENT')]\n"
        f"OPS = [OpDef(namespace='{ns}', name='f', schema='(Tensor x) -> Tensor')]\n")
    hooks = (f"from {ns}_shared import NS, OPS\n"
             "def opregistry_namespaces():\n    return NS\n"
             "def opregistry_ops():\n    return OPS\n")
    dists.make("share-a", ops={"a": f"{ns}_a"},
               modules={f"{ns}_shared": shared, f"{ns}_a": hooks})
    dists.make("share-b", ops={"b": f"{ns}_b"}, modules={f"{ns}_b": hooks})
    registry = load(dists)
    # both define ns::f: the problem names both, which it can only do if the one
    # record object, collected twice, was attributed to each distribution
    conflict = [p for p in registry.problems if f"{ns}::f" in p.message]
    assert conflict, [p.message for p in registry.problems]
    assert {"share-a", "share-b"} <= {c.distribution for p in conflict for c in p.culprits}


def test_signature_memo_returns_equal_records_and_keeps_raising() -> None:
    text = "(Tensor x, int n=2, *, float c=1.) -> Tensor"
    assert schema.parse_signature(text) == schema._parse(text, named=False)
    assert schema.parse_signature(text) is schema.parse_signature(text)
    for _ in range(2):  # a bad text is not cached: it raises every time
        with pytest.raises(SchemaError, match="appears twice"):
            schema.parse_signature("(Tensor x, Tensor x) -> Tensor")
    with pytest.raises(SchemaError, match="a schema is a string"):
        schema.parse_signature(["not", "a", "string"])  # type: ignore[arg-type]


def test_missing_kernel_in_an_imported_module_fails_its_distribution(
        dists: DistFactory, ns: str) -> None:
    """The shortcut for modules already imported still fails the distribution whole."""
    body = ("import KMOD  # imported before materialize: the shortcut's case\n"
            'lib.define("ok(Tensor x) -> Tensor", kernels={"cpu": "KMOD:clone"})\n'
            'lib.define("bad(Tensor x) -> Tensor", kernels={"cpu": "KMOD:no_such_kernel"})\n')
    op_dist(dists, "missing-kernel", ns, body)
    registry = load(dists)
    problems = [p for p in registry.problems if p.code == "materialize-failed"]
    assert len(problems) == 1
    assert "no_such_kernel" in problems[0].message and "missing-kernel" in problems[0].message
    assert f"{ns}::ok" not in registry.op_names  # nothing of it registered
    with pytest.raises(opregistry.ResolutionError, match="no_such_kernel"):
        load(dists, strict=True)


def test_a_plugins_hook_implementations_are_what_pluggy_lists() -> None:
    """collect finds a plugin's hooks from its own registration: the same as pluggy's lookup."""
    from opregistry import hookimpl
    from opregistry.collect import _hookimpls, make_plugin_manager

    class Named:
        @hookimpl(specname="opregistry_ops")
        def first(self) -> list[object]:
            return []

        @hookimpl(specname="opregistry_ops")
        def second(self) -> list[object]:
            return []

        def opregistry_namespaces(self) -> list[object]:  # unmarked: taken by its name
            return []

    class Early:
        @hookimpl(tryfirst=True)
        def opregistry_ops(self) -> list[object]:
            return []

    class Late:
        @hookimpl(trylast=True)
        def opregistry_kernels(self) -> list[object]:
            return []

        def opregistry_ops(self) -> list[object]:
            return []

    pm = make_plugin_manager()
    plugins = [Early(), Named(), Late(), Early(), Named(), Late()]
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"p{i}")
        found = _hookimpls(pm, plugin)
        # the long way: every hook caller the plugin is in, its implementations in pluggy's order
        want = {caller.name: [impl for impl in caller.get_hookimpls() if impl.plugin is plugin]
                for caller in pm.get_hookcallers(plugin) or ()}
        assert found == want and all(found.values()), (i, found, want)
    assert [i.function.__name__ for i in _hookimpls(pm, plugins[-2])["opregistry_ops"]] \
        == ["first", "second"]


def test_remembered_non_hooks_answer_as_pluggy_does() -> None:
    """The per-class memo of names that are no hooks never hides a hook pluggy would find.

    Each plugin is registered with opregistry's manager (the memo warm from the
    plugins before it) and parsed name by name by pluggy's own manager: the
    same hook implementations must come out, for instances that hold a marked
    function themselves (``__dict__`` or a ``__slots__`` slot), a subclass that
    marks a method its parent has unmarked, and modules and classes as plugins.
    """
    import types

    import pluggy

    from opregistry import hookimpl, hookspecs
    from opregistry.collect import make_plugin_manager

    @hookimpl(specname="opregistry_ops")
    def marked(self: object = None) -> list[object]:
        return []

    class Plain:
        def helper(self) -> list[object]:
            return []

    class Marked(Plain):
        @hookimpl(specname="opregistry_ops")
        def helper(self) -> list[object]:
            return []

    class Slotted:
        __slots__ = ("helper",)

    slotted_empty, slotted_marked = Slotted(), Slotted()
    slotted_marked.helper = types.MethodType(marked, slotted_marked)
    holder = Plain()
    holder.helper = types.MethodType(marked, holder)  # the instance's own, bound
    module = types.ModuleType("plugin_module")
    module.helper = marked  # type: ignore[attr-defined]

    class AsClass:
        helper = staticmethod(marked)

    class EqMeta(type):  # a metaclass with __eq__ and no __hash__: its classes are unhashable
        def __eq__(cls, other: object) -> bool:
            return cls is other

        __hash__ = None  # type: ignore[assignment]

    class Unhashable(metaclass=EqMeta):
        @hookimpl(specname="opregistry_ops")
        def helper(self) -> list[object]:
            return []

        def other(self) -> None:
            pass

    class Propertied:  # pluggy >= 1.6 skips properties, older ones evaluate them
        @property
        def helper(self) -> object:
            return marked

    plugins = [Plain(), Plain(), holder, Plain(), Marked(), Plain(), slotted_empty,
               slotted_marked, Slotted(), module, AsClass, Propertied(), Propertied(),
               Unhashable(), Unhashable(), Plain()]
    pm = make_plugin_manager()
    stock = pluggy.PluginManager(hookspecs.PROJECT)
    stock_finds_property = stock.parse_hookimpl_opts(Propertied(), "helper") is not None
    # Python >= 3.12's inspect.getattr_static (pluggy reads hook attributes with it) hashes
    # the class: stock pluggy cannot register an instance of an unhashable class there
    try:
        stock.parse_hookimpl_opts(Unhashable(), "helper")
        stock_takes_unhashable = True
    except TypeError:
        stock_takes_unhashable = False
    for i, plugin in enumerate(plugins):
        pm.parsed = []
        if isinstance(plugin, Unhashable) and not stock_takes_unhashable:
            with pytest.raises(TypeError):  # as pluggy itself does
                pm.register(plugin, name=f"p{i}")
            continue
        pm.register(plugin, name=f"p{i}")
        want = [name for name in dir(plugin)
                if stock.parse_hookimpl_opts(plugin, name) is not None]
        assert sorted(pm.parsed) == sorted("opregistry_ops" for _ in want), (i, want)
    assert [bool(pm.get_hookcallers(p)) for p in plugins] == [
        False, False, True, False, True, False, False, True, False, True, True,
        *[stock_finds_property] * 2, *[stock_takes_unhashable] * 2, False]


def test_kernel_sort_key_orders_as_the_general_one() -> None:
    """The resolver sorts kernels by a shorter key: the same order as the general key."""
    import itertools
    import random

    from opregistry.resolver import _kernel_order, _order

    origins = [None, ORIGIN, OTHER, attrs.evolve(OTHER, entry_point="ep0"),
               attrs.evolve(ORIGIN, value="mod:lib2"), attrs.evolve(ORIGIN, group="g")]
    kernels = [Kernel(op=op, key=key, fn=fn, override=override, source=source, origin=origin)
               for op, key, fn, override, source, origin in itertools.product(
                   ("nsx::f", "nsx::a"), ("cpu", "Meta"), ("mod:k", "mod:a", len),
                   (False, True), (None, "m.py:1", "m.py:2"), origins)]
    rnd = random.Random(7)
    for _ in range(5):
        rnd.shuffle(kernels)
        # stable sorts: equal keys keep the shuffled order, so the keys must tie alike
        assert [id(k) for k in sorted(kernels, key=_kernel_order)] \
            == [id(k) for k in sorted(kernels, key=_order)]
    assert _kernel_order(RECORDS[0]) == _order(RECORDS[0])  # not a kernel: the general key


def test_kernels_a_module_provides_through_getattr_still_run_contained(
        dists: DistFactory, ns: str) -> None:
    """A kernel an imported module makes in ``__getattr__`` (PEP 562) takes the long way.

    The shortcut reads only the module's own namespace, where no plugin code
    runs; a kernel made by the module's ``__getattr__`` is still found, and a
    ``__getattr__`` that raises (even ``SystemExit``) fails its distribution
    only.
    """
    import torch

    kernels = ("import torch\n"
               "def __getattr__(name):\n"
               "    if name == 'made':\n"
               "        return lambda x: x + 1\n"
               "    raise AttributeError(name)\n")
    body = ("import KMOD  # imported before materialize\n"
            'lib.define("made(Tensor x) -> Tensor", kernels={"cpu": "KMOD:made"})\n')
    op_dist(dists, "getattr-kernel", ns, body, kernels=kernels)
    registry = load(dists)
    assert f"{ns}::made" in registry.op_names
    assert torch.equal(getattr(torch.ops, ns).made(torch.zeros(2)), torch.ones(2))


def test_a_raising_module_getattr_fails_only_its_distribution(dists: DistFactory, ns: str) -> None:
    kernels = "def __getattr__(name):\n    raise SystemExit(3)\n"
    body = ("import KMOD  # imported before materialize\n"
            'lib.define("gone(Tensor x) -> Tensor", kernels={"cpu": "KMOD:gone"})\n')
    op_dist(dists, "getattr-raises", ns, body, kernels=kernels)
    registry = load(dists)
    problems = [p for p in registry.problems if p.code == "materialize-failed"]
    assert len(problems) == 1 and "getattr-raises" in problems[0].message, registry.problems
    assert "SystemExit" in problems[0].message
    assert f"{ns}::gone" not in registry.op_names
