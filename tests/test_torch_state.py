"""The private torch APIs opregistry reads (opregistry/torch_state.py) still exist and behave.

torch has no public API for "which ops does the dispatcher hold" or "is there
a kernel for (op, key)"; opregistry isolates the private calls in one module.
These tests fail loudly, naming the call, when a torch release changes them.
"""

from __future__ import annotations

from typing import Any

import torch

from opregistry import torch_state


def test_registered_ops_lists_aten_and_new_ops(ns):
    """Every op, aten's and one defined a moment ago without a kernel: torch's full list."""
    assert "aten::add.Tensor" in torch_state.registered_ops()
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("probe(Tensor x) -> Tensor")  # no kernel: still an op
        assert f"{ns}::probe" in torch_state.registered_ops()
        # the faster call it makes gives exactly torch's list of every op name
        assert sorted(torch_state.registered_ops()) == sorted(
            torch._C._dispatch_get_all_op_names())
    finally:
        lib._destroy()
    assert f"{ns}::probe" not in torch_state.registered_ops()


def test_has_kernel_per_dispatch_key(ns):
    """_dispatch_has_kernel_for_dispatch_key answers per key, and False for unknown ops."""
    assert torch_state.has_kernel("aten::add.Tensor", "CPU")
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("probe(Tensor x) -> Tensor")
        assert not torch_state.has_kernel(f"{ns}::probe", "CPU")
        lib.impl("probe", lambda x: x.clone(), "CPU")
        assert torch_state.has_kernel(f"{ns}::probe", "CPU")
        assert not torch_state.has_kernel(f"{ns}::probe", "CUDA")
    finally:
        lib._destroy()
    assert not torch_state.has_kernel(f"{ns}::no_such_op", "CPU")


def test_snapshot_sees_foreign_namespaces_and_tags(ns):
    """A Library made outside opregistry shows up as a namespace torch holds."""
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("probe(Tensor x) -> Tensor")
        state = torch_state.snapshot()
        assert ns in state.namespaces and "aten" in state.namespaces
        assert f"{ns}::probe" in state.ops
        assert state.has_kernel("aten::add.Tensor", "CPU")
        # exactly this torch's tags (torch.Tag.out / .inplace exist from 2.13 only)
        assert "pt2_compliant_tag" in state.tags
        assert state.tags == set(torch.Tag.__members__)
    finally:
        lib._destroy()


def test_static_tables_match_this_torch():
    """The resolver's torch-free tables (tags, reserved namespaces) agree with torch itself.

    ``opregistry list`` cannot ask torch, so it relies on these tables; when a
    torch release adds a tag or a namespace, this test says which.  It looks
    at a fresh ``import torch`` (autoload off): later imports (torch.distributed,
    torch.onnx, ...) add namespaces that the resolver learns from the live
    dispatcher whenever torch is imported.
    """
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, torch\n"
        "from opregistry import torch_state\n"
        "tags = sorted(n for n in dir(torch.Tag) if not n.startswith('_') and n not in ('name', 'value'))\n"
        "nss = sorted({op.split('::', 1)[0] for op in torch_state.registered_ops()})\n"
        "print(json.dumps([tags, nss]))\n"
    )
    env = {**os.environ, "OPREGISTRY_AUTOLOAD": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    tags, namespaces = json.loads(proc.stdout.splitlines()[-1])

    from opregistry.keys import KNOWN_TAGS, RESERVED_NAMESPACES, installed_torch, tags_of

    facts = installed_torch()
    assert facts is not None and facts.version == torch_version_of_this_process()
    # what opregistry reads from torch's files, its per-release table and torch.Tag agree
    assert facts.tags == set(tags), f"tags.yaml vs torch.Tag: {sorted(facts.tags ^ set(tags))}"
    assert tags_of(facts.release) == set(tags), (
        f"keys.TAG_SINCE is out of date for torch {facts.version}: "
        f"{sorted(tags_of(facts.release) ^ set(tags))}")
    assert set(tags) <= KNOWN_TAGS
    missing = set(namespaces) - RESERVED_NAMESPACES
    assert not missing, f"torch defines namespaces the resolver does not reserve: {sorted(missing)}"


#: torch's modules that define namespaces when first imported (keys.LAZY_NAMESPACES)
LAZY_MODULES = ("torch._dynamo", "torch._inductor.lowering", "torch._higher_order_ops",
                "torch.distributed._functional_collectives", "torch.nn.attention.flex_attention",
                "torch.onnx", "torch.export", "torch.ao.quantization")


def test_the_namespaces_torch_defines_later_are_reserved():
    """A namespace torch's own modules define when first imported (``torch.compile`` imports
    torch._dynamo: torch 2.15 defines ``mempool`` there) is as reserved as ``aten``: a package
    that took it would break ``torch.compile`` for everyone."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import importlib, json, sys, torch\n"
        "from opregistry import torch_state\n"
        "before = set(torch_state.registered_ops())\n"
        "for m in sys.argv[1:]:\n"
        "    importlib.import_module(m)\n"
        "new = set(torch_state.registered_ops()) - before\n"
        "print(json.dumps(sorted({op.split('::', 1)[0] for op in new})))\n"
    )
    env = {**os.environ, "OPREGISTRY_AUTOLOAD": "0"}
    proc = subprocess.run([sys.executable, "-c", code, *LAZY_MODULES], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    later = set(json.loads(proc.stdout.splitlines()[-1]))

    from opregistry.keys import RESERVED_NAMESPACES

    assert later, "importing torch's lazy modules defined no namespace: the probe is broken"
    assert not later - RESERVED_NAMESPACES, (
        f"torch's modules define namespaces the resolver does not reserve: "
        f"{sorted(later - RESERVED_NAMESPACES)} (keys.LAZY_NAMESPACES)")


#: a fresh interpreter's ``import torch`` with opregistry's autoload and no cache: the
#: namespaces in the dispatcher when the autoload loads, and once ``import torch`` is over
_LATE_PROBE = """
import json
from opregistry import registry, torch_state
at_load = []
snapshot = registry._snapshot
def spy():
    at_load.append(set(torch_state.registered_ops()))
    return snapshot()
registry._snapshot = spy
import torch
from opregistry.materializer import defined_ops
after = set(torch_state.registered_ops()) - set(defined_ops())  # less the op packages' ops
print(json.dumps({"loads": len(at_load), "late": sorted(
    {op.split("::", 1)[0] for op in after - at_load[0]}) if at_load else None,
    "seen": sorted({op.split("::", 1)[0] for op in registry._snapshot().ops})}))
"""


def test_the_namespaces_torch_defines_after_the_autoload_are_late():
    """``import torch`` defines ``torch._native``'s namespaces after the device-backend
    autoload (its last line): keys.LATE_NAMESPACES names every namespace that comes then, and
    the resolver's snapshot leaves them out, so that a plan made at ``import torch`` and one
    made later see the same dispatcher."""
    import json
    import os
    import subprocess
    import sys

    from opregistry.keys import LATE_NAMESPACES, RESERVED_NAMESPACES

    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env["OPREGISTRY_CACHE"] = "0"
    proc = subprocess.run([sys.executable, "-c", _LATE_PROBE], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["loads"] >= 1, "the autoload did not load: the probe is broken"
    assert set(found["late"]) <= LATE_NAMESPACES, (
        f"import torch defines namespaces after its autoload that keys.LATE_NAMESPACES lacks: "
        f"{sorted(set(found['late']) - LATE_NAMESPACES)}")
    # torch._native defines its namespace late (2.13, 2.15); 2.12's defines no op
    import torch

    native_ops = any(n.startswith("_native::") for n in torch._C._dispatch_get_all_op_names())
    assert "_native" in found["late"] or not native_ops
    assert not LATE_NAMESPACES & set(found["seen"]) and LATE_NAMESPACES <= RESERVED_NAMESPACES


#: run in a fresh interpreter: the names torch.ops and its objects answer themselves
_OPS_ATTRIBUTES_PROBE = """
import json, torch

def names(obj):
    found = set(vars(obj))
    for cls in type(obj).__mro__:
        found |= set(vars(cls))
    return found

ops = torch.ops
namespace = type(ops.aten)("zz_probe_namespace")  # a fresh namespace object, as torch makes
packet = ops.aten.add
print(json.dumps({"ops": sorted(names(ops) - set(ops._dir)),
                  "namespace": sorted(names(namespace)),
                  "packet": sorted(names(packet) - set(packet._overload_names))}))
"""


def test_torch_ops_attribute_tables_match_this_torch():
    """keys.TORCH_OPS_ATTRIBUTES & co. are exactly what a fresh ``import torch`` answers itself.

    A namespace, op or overload with one of these names is unreachable through
    ``torch.ops``; the resolver refuses them before torch is imported.  When a
    release adds an attribute to ``torch.ops`` (or a namespace object, or an op
    packet), this test names it.
    """
    import json
    import os
    import subprocess
    import sys

    from opregistry.keys import (OP_NAMESPACE_ATTRIBUTES, OP_PACKET_ATTRIBUTES, PYTHON_DUNDERS,
                                 TORCH_OPS_ATTRIBUTES, installed_torch, unreachable_name)

    env = {**os.environ, "OPREGISTRY_AUTOLOAD": "0"}
    proc = subprocess.run([sys.executable, "-c", _OPS_ATTRIBUTES_PROBE], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])

    def plain(names):  # the dunders, Python's own, are checked against PYTHON_DUNDERS below
        return {n for n in names if not (n.startswith("__") and n.endswith("__"))}

    for where in ("ops", "namespace"):  # every dunder this Python and torch answer themselves
        dunders = set(found[where]) - plain(found[where])
        assert dunders <= PYTHON_DUNDERS, (where, dunders - PYTHON_DUNDERS)

    assert plain(found["ops"]) == TORCH_OPS_ATTRIBUTES
    assert plain(found["namespace"]) == OP_NAMESPACE_ATTRIBUTES
    facts = installed_torch()
    assert facts is not None
    # op_overloads exists from 2.13; "default" is refused as a name whether or not the
    # packet of the probed op has bound it
    expected = OP_PACKET_ATTRIBUTES - {"default"} - (
        {"op_overloads"} if facts.release < (2, 13) else set())
    assert plain(found["packet"]) - {"default"} == expected
    for kind, names in (("namespace", found["ops"]), ("op", found["namespace"]),
                        ("overload", found["packet"])):
        assert all(unreachable_name(n, kind) for n in names), kind


def test_unreachable_names_are_unreachable_in_torch(ns):
    """What keys says of each table is what torch does: the name cannot be reached, or is refused."""
    from opregistry.keys import OP_NAMESPACE_ATTRIBUTES, OP_PACKET_ATTRIBUTES

    for name in sorted(OP_NAMESPACE_ATTRIBUTES):
        lib = torch.library.Library(f"{ns}_{name.strip('_')}", "DEF")
        try:
            try:
                lib.define(f"{name}(Tensor x) -> Tensor")
            except Exception:
                continue  # refused by torch: what the resolver says first
            assert not isinstance(getattr(getattr(torch.ops, lib.ns), name),
                                  torch._ops.OpOverloadPacket), name
        finally:
            lib._destroy()
    from opregistry.keys import installed_torch

    facts = installed_torch()
    assert facts is not None
    # refused on every release of the range, reachable before the release that adds it
    newer = {"op_overloads"} if facts.release < (2, 13) else set()
    for name in sorted(OP_PACKET_ATTRIBUTES - newer):
        lib = torch.library.Library(f"{ns}_p{name.strip('_')}", "DEF")
        try:
            try:
                lib.define(f"f.{name}(Tensor x) -> Tensor")
            except Exception:
                continue
            overload = getattr(getattr(torch.ops, lib.ns).f, name)
            assert not isinstance(overload, torch._ops.OpOverload), name
        finally:
            lib._destroy()


def test_dunder_op_names_reach_torch_as_keys_says(ns):
    """A dunder op name is reachable unless Python's object answers it (keys.PYTHON_DUNDERS)."""
    from opregistry.keys import unreachable_name

    for i, name in enumerate(("__and__", "__foo__", "__repr__", "__init__", "__origin__")):
        lib = torch.library.Library(f"{ns}_d{i}", "DEF")
        try:
            try:
                lib.define(f"{name}(Tensor x) -> Tensor")
            except Exception:  # torch fails inside (the name is found on the namespace object)
                reached = False
            else:
                found = getattr(getattr(torch.ops, lib.ns), name, None)
                reached = isinstance(found, torch._ops.OpOverloadPacket)
            assert reached == (unreachable_name(name, "op") is None), name
        finally:
            lib._destroy()
    assert unreachable_name("__foo__", "overload") is not None


def torch_version_of_this_process() -> str:
    import torch

    return torch.__version__.partition("+")[0]


def test_native_library_reads(ns):
    """What loading a native library relies on: the build facts, registrations per key,
    definition sites, schema normalization (torch._C private calls)."""
    from opregistry.keys import installed_torch_build

    version, abi, cuda = torch_state.torch_build()
    assert version == torch.__version__ and abi == bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert installed_torch_build() == (torch.__version__, cuda)  # from disk, same answer
    ops, pairs = torch_state.dispatcher_registrations()
    assert "aten::add.Tensor" in ops and "aten::add.Tensor" in pairs["CPU"]
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("probe(Tensor x) -> Tensor")
        lib.impl("probe", lambda x: x.clone(), "CPU")
        after_ops, after_pairs = torch_state.dispatcher_registrations()
        assert f"{ns}::probe" in after_ops - ops
        assert torch_state.new_kernels(pairs, after_pairs) == {(f"{ns}::probe", "CPU")}
        assert torch_state.new_kernels(after_pairs, pairs) == set()
        site = torch_state.definition_site(f"{ns}::probe")
        # torch 2.8 writes /dev/null:LINE for every Python registration (site_recorded)
        assert site.startswith(__file__ + ":") or not torch_state.site_recorded(site)
    finally:
        lib._destroy()
    assert torch_state.definition_site(f"{ns}::probe") is None
    assert torch_state.normal_schema("ns::f(Tensor  x)->Tensor") == "ns::f(Tensor x) -> Tensor"


def test_schema_type_table_matches_this_torchs_parser(ns):
    """keys.TYPE_SINCE says which schema types this torch's parser refuses, exactly.

    Every type the resolver accepts (schema.BASE_TYPES) is tried with torch's own
    parser and with ``Library.define``: the ones that fail must be the ones the
    table says this release lacks (SymBool before 2.13), and no others.
    """
    from opregistry.keys import installed_torch, types_lacking
    from opregistry.schema import BASE_TYPES

    facts = installed_torch()
    assert facts is not None
    refused = set()
    lib = torch.library.Library(ns, "DEF")
    try:
        for i, base in enumerate(sorted(BASE_TYPES)):
            if base == "Tensor":
                continue
            try:
                torch._C.parse_schema(f"{ns}::p{i}(Tensor x, {base} y) -> Tensor")
            except RuntimeError as exc:
                assert "unknown type specifier" in str(exc), exc
                refused.add(base)
                continue
            lib.define(f"d{i}(Tensor x, {base} y) -> Tensor")  # what parses, registers
    finally:
        lib._destroy()
    assert refused == set(types_lacking(BASE_TYPES, facts.release)), (
        f"keys.TYPE_SINCE is out of date for torch {facts.version}: torch refuses {sorted(refused)}")


def test_has_class_reads_torchs_custom_class_registry():
    """_get_custom_class_python_wrapper(ns, name) finds a registered class, raises otherwise."""
    assert torch_state.has_class("c10d.Work")
    assert not torch_state.has_class("nolib.Nothing")
    assert not torch_state.has_class("c10d")  # no class name: not a class
    assert torch_state.snapshot().has_class is torch_state.has_class


def _build() -> tuple[tuple[int, int], bool]:
    from opregistry.keys import installed_torch, installed_torch_build

    facts, build = installed_torch(), installed_torch_build()
    assert facts is not None and build is not None
    return facts.release, build[1] is not None


def test_custom_class_table_matches_this_torch():
    """keys.TORCH_CLASSES says which custom classes this torch registers at import, exactly:
    every class of the table is checked, and every class torch's own schemas use is in it."""
    import re

    from opregistry.keys import TORCH_CLASSES, class_known

    release, cuda = _build()
    wrong = {c for c in TORCH_CLASSES if class_known(c, release, cuda) != torch_state.has_class(c)}
    assert not wrong, f"keys.TORCH_CLASSES is out of date for torch {torch.__version__}: {wrong}"
    used = {m for s in torch._C._jit_get_all_schemas()
            for m in re.findall(r"__torch__\.torch\.classes\.(\w+\.\w+)", str(s))}
    assert used and used <= set(TORCH_CLASSES), sorted(used - set(TORCH_CLASSES))


def test_dtype_table_matches_this_torch():
    """The dtype names a ScalarType default may use are this torch's dtype attributes, exactly."""
    from opregistry.keys import all_dtype_names, dtypes_lacking

    release, _ = _build()
    ours = all_dtype_names() - set(dtypes_lacking(all_dtype_names(), release))
    theirs = {n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    assert ours == theirs, f"keys.DTYPE_SINCE is out of date for torch {torch.__version__}"


def test_device_types_match_this_torch(ns):
    """keys.DEVICE_TYPES are the device types torch's Device parser names, exactly."""
    import re
    import warnings

    from opregistry.keys import DEVICE_TYPES

    lib = torch.library.Library(ns, "DEF")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that 'mkldnn' is deprecated
            for i, device in enumerate(sorted(DEVICE_TYPES)):
                lib.define(f"d{i}(Device x=\"{device}\") -> ()")
        try:
            lib.define('bad(Device x="nodevice") -> ()')
        except RuntimeError as exc:
            listed = re.search(r"Expected one of (.*?) device type", str(exc))
        assert listed is not None
        assert set(listed.group(1).split(", ")) == DEVICE_TYPES
    finally:
        lib._destroy()


def test_ops_namespace_attributes_are_shadowed_names():
    """Every attribute of a torch.ops namespace is a name keys.shadowed_op_name refuses."""
    from opregistry.keys import shadowed_op_name

    namespace = getattr(torch.ops, "opregistry_probe_ns")
    names = set(dir(namespace)) | set(dir(type(namespace)))
    assert names and all(shadowed_op_name(n) for n in names), sorted(
        n for n in names if not shadowed_op_name(n))
    assert not shadowed_op_name("silu_and_mul") and not shadowed_op_name("__and__")


def test_replacement_warning_has_the_shape_replaced_kernels_reads(ns):
    """torch's "Overriding a previously registered kernel" warning, as this torch writes it.

    ``replaced_kernels`` reads it from file descriptor 2 while a C++ library
    loads (tests/test_native.py replaces aten::add.Tensor's kernel for real); a
    Python registration gets the same text as a Python warning.  With
    ``set_warn_always`` on it comes for every replacement, not once per process.
    """
    import warnings

    import inspect

    # torch 2.8 refuses a second Python kernel for one (op, key) without allow_override
    override = ({"allow_override": True}
                if "allow_override" in inspect.signature(torch.library.Library.impl).parameters
                else {})
    lib = torch.library.Library(ns, "DEF")
    was = torch.is_warn_always_enabled()
    try:
        lib.define("probe(Tensor x) -> Tensor")
        lib.impl("probe", lambda x: x, "CPU")
        torch.set_warn_always(True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for n in (1, 2):
                lib.impl("probe", lambda x, n=n: x + n, "CPU", **override)
    finally:
        torch.set_warn_always(was)
        lib._destroy()
    texts = [str(w.message) for w in caught if "Overriding a previously" in str(w.message)]
    assert len(texts) == 2, "one warning per replacement while warn_always is on"
    found: list[tuple[str, str, str]] = []
    rest = torch_state._parse_replacements("before\n" + texts[0] + "\nafter\n", found)
    assert [(op, key) for op, key, _ in found] == [(f"{ns}::probe", "CPU")]
    # the new kernel's file (torch 2.8 writes /dev/null:LINE for Python registrations)
    assert found[0][2].startswith(__file__) or not torch_state.site_recorded(found[0][2]), found
    assert rest == "before\nafter\n", "other output is passed on"


def test_replaced_kernels_passes_other_stderr_output_on(capfd):
    """What is written to file descriptor 2 meanwhile, not a replacement warning, still shows."""
    import os

    with torch_state.replaced_kernels() as found:
        os.write(2, b"a line of someone else's\n")
    assert found == []
    assert "a line of someone else's" in capfd.readouterr().err


def test_ops_lookup_hooks_have_the_shape_lazy_adoption_wraps(ns, monkeypatch):
    """torch.ops' namespace creation and op lookup, as install_ops_hooks wraps them.

    ``type(torch.ops).__getattr__(self, name)`` makes ``torch.ops.<ns>`` on its
    first touch and caches it on ``torch.ops``; ``_OpNamespace.__getattr__(self,
    op_name)`` raises ``AttributeError`` for an op the dispatcher lacks, and
    the namespace knows its ``name``.  With the hooks installed, an adopter
    sees both, before torch caches anything.
    """
    import inspect

    from opregistry.state import process

    ops_class, namespace_class = type(torch.ops), torch_state._namespace_class()
    assert namespace_class is not None and namespace_class.__name__ == "_OpNamespace"
    for cls, params in ((ops_class, ["self", "name"]), (namespace_class, ["self", "op_name"])):
        getattr_ = vars(cls)["__getattr__"]
        original = getattr(getattr_, "__wrapped__", getattr_)
        assert list(inspect.signature(original).parameters) == params, cls
    assert torch_state.install_ops_hooks()

    seen: list[tuple[str, ...]] = []

    from opregistry.adopting import NamespaceHolds

    class Adopter:
        def __init__(self):
            self.namespaces = {ns: ()}
            self.lib = None
            self.holds = NamespaceHolds()

        def importing(self, name):
            return False  # nothing of the namespace is being imported

        def namespace_touched(self, name):
            # as opregistry.adopting.Adopter: taken off the table first (define touches it)
            self.namespaces.pop(name)
            seen.append((name, str(ns in vars(torch.ops))))
            self.lib = torch.library.Library(ns, "FRAGMENT")
            self.lib.define("probe(Tensor x) -> Tensor")

        def op_missing(self, namespace, name):
            seen.append((namespace, name))
            if name == "late" and (namespace, name) not in seen[:-1]:
                self.lib.define("late(Tensor x) -> Tensor")
                return True
            return False

    adopter = Adopter()
    monkeypatch.setattr(process(), "adopter", adopter)
    try:
        namespace = getattr(torch.ops, ns)
        assert namespace.name == ns and vars(torch.ops)[ns] is namespace  # cached by torch
        assert namespace.probe.default.name() == f"{ns}::probe"
        assert namespace.late.default.name() == f"{ns}::late"
        try:
            namespace.absent
        except AttributeError:
            pass
        else:
            raise AssertionError("a missing op must still raise AttributeError")
        # before torch made the namespace; define() itself asks whether an op exists yet
        # (hasattr), so the misses come with a few of its own
        assert seen[0] == (ns, "False") and {(ns, "late"), (ns, "absent")} <= set(seen)
    finally:
        if adopter.lib is not None:
            adopter.lib._destroy()



def test_the_recorder_wraps_what_torch_still_has(ns):
    """The Library methods and the C++ call the recorder wraps exist with the arguments it reads,
    and torch still records the registering code's line through the wrapper (a fake kernel's
    source is read ``_stacklevel`` frames up, one more through the recorder)."""
    import inspect

    from torch._library.simple_registry import singleton

    from opregistry.torch_state import _SLOTS, _STACKLEVEL, recorder

    library = torch.library.Library
    for method in _SLOTS:
        assert callable(getattr(library, method, None)), method
    assert list(inspect.signature(library.impl).parameters)[1:4] == ["op_name", "fn", "dispatch_key"]
    assert list(inspect.signature(library._register_fake).parameters)[1:4] == [
        "op_name", "fn", "_stacklevel"] and _STACKLEVEL["_register_fake"] == 2
    assert list(inspect.signature(library._register_torch_dispatch_rule).parameters)[1:3] == [
        "op_name", "torch_dispatch_class"]
    assert callable(torch._C._dispatch_library)
    recorder()
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("probe(Tensor x) -> Tensor")
        line = inspect.currentframe().f_lineno + 1
        torch.library.register_fake(f"{ns}::probe", lambda x: torch.empty_like(x), lib=lib)
        source = singleton.find(f"{ns}::probe").fake_impl.kernel.source
        assert source == f"{__file__}:{line}", source
    finally:
        lib._destroy()


def test_a_note_on_torchs_error_reads_on_every_python():
    """Python 3.11+ shows a note under the message; 3.10 has none, so it ends the message."""
    from opregistry.torch_state import add_note

    exc = RuntimeError("Only a single TORCH_LIBRARY ...")
    add_note(exc, "opregistry: who")
    assert exc.__notes__ == ["opregistry: who"] and str(exc) == "Only a single TORCH_LIBRARY ..."

    class NoNotes(RuntimeError):  # as on Python 3.10
        add_note = None

    old = NoNotes("Only a single TORCH_LIBRARY ...")
    add_note(old, "opregistry: who")
    assert str(old) == "Only a single TORCH_LIBRARY ...\nopregistry: who"


def test_torch_keeps_a_python_kernel_after_its_library_is_destroyed() -> None:
    """What docs/performance.md ("Exit") says of torch: a Python kernel registered with
    ``Library.impl`` outlives its ``Library``'s destruction (2.8 to 2.15 alike), so the
    backends' per-op kernels stay to the end of the process whatever an unload does.
    A torch that gives them back fails this, and the page is to be corrected."""
    import gc
    import weakref

    lib = torch.library.Library("opregistry_kept_kernel", "DEF")
    lib.define("f(Tensor x) -> Tensor")

    def make() -> Any:
        def kernel(x: torch.Tensor) -> torch.Tensor:
            return x
        return kernel

    kernel = make()
    kept = weakref.ref(kernel)
    lib.impl("f", kernel, "CPU")
    del kernel
    torch_state.destroy_library(lib)
    del lib
    gc.collect()
    assert kept() is not None


def test_registering_inside_import_torch_clears_its_initializing_mark_only_when_alone(
        monkeypatch: Any) -> None:
    """Inside ``import torch`` (torch's module marked initializing) opregistry's registrations
    run with the mark cleared when no other thread exists, and set back after, even when the
    backend raises; with another thread alive the mark stays (that thread may be waiting)."""
    import threading

    from opregistry.materializer import _call_backend
    from opregistry.model import Origin

    monkeypatch.setattr(torch.__spec__, "_initializing", True, raising=False)
    # the suite may leave threads of its own behind: "alone" is asked of the threading
    # module, answered here as in a fresh `import torch` (tests/test_autoload.py runs one)
    monkeypatch.setattr(torch_state.threading, "active_count", lambda: 1)
    seen: list[bool] = []

    def hook(*_: Any) -> bool:
        seen.append(torch.__spec__._initializing)
        return True

    def failing(*_: Any) -> bool:
        seen.append(torch.__spec__._initializing)
        raise RuntimeError("the backend failed")

    origin = Origin("dist-a", "1.0", "opregistry.ops", "ep", "mod:lib")
    kernel = type("K", (), {"key": "CPU", "op": "ns::f", "origin": origin, "source": None})()
    assert _call_backend(hook, "b", kernel, None) is None
    with torch_state.registering():
        seen.append(torch.__spec__._initializing)
    problem = _call_backend(failing, "b", kernel, None)
    assert problem is not None and "the backend failed" in problem.message
    assert seen == [False, False, False]
    assert torch.__spec__._initializing is True

    monkeypatch.undo()  # the real count: the thread below makes it at least two
    monkeypatch.setattr(torch.__spec__, "_initializing", True, raising=False)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        _call_backend(hook, "b", kernel, None)
        with torch_state.registering():
            seen.append(torch.__spec__._initializing)
    finally:
        stop.set()
        other.join()
    assert seen[3:] == [True, True]
    assert torch.__spec__._initializing is True
