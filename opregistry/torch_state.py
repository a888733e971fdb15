"""What torch's dispatcher already holds — the one module of the core that reads torch internals.

The resolver needs to know which ops and namespaces exist in torch outside
opregistry (rule 4: a DEF of a namespace a C++ ``TORCH_LIBRARY`` holds) and
whether torch already has a kernel for an (op, key) (rule 5); the
materializer and the device backends need a few private handles on a
``Library`` and on dispatch keys.  torch has no public API for any of these,
so every private call of the core is here, and ``tests/test_torch_state.py``
fails loudly if torch renames one or changes its signature.  (Each backend
plugin keeps its own private calls in its ``_torch_private.py``.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Callable, Iterable, Iterator

from .plan import TorchState

__all__ = ["snapshot", "registered_ops", "has_kernel", "has_class", "op_schema", "kernel_registrations",
           "destroy_library", "library_alive", "device_keyset", "lookup_op",
           "Watch", "watch_registrations", "library_registrations", "torch_dir",
           "torch_build", "load_native", "dispatcher_registrations", "new_kernels", "normal_schema",
           "definition_site", "fast_dispatch_available", "enable_fast_dispatch",
           "fast_dispatch_enabled", "site_recorded"]


def registered_ops() -> list[str]:
    """Every op in the dispatcher, as ``ns::name`` or ``ns::name.overload``."""
    import torch

    # the same names as _dispatch_get_all_op_names (every op, with or without kernels:
    # no key given), 3x faster; checked against it in tests/test_torch_state.py
    return list(torch._C._dispatch_get_registrations_for_dispatch_key(""))


def has_kernel(op: str, key: str) -> bool:
    """Whether the dispatcher has a kernel for ``op`` registered directly at ``key``."""
    import torch

    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, key))
    except RuntimeError:
        return False


def has_class(name: str) -> bool:
    """Whether torch has the custom class ``NS.Class`` (the schema type
    ``__torch__.torch.classes.NS.Class``) registered, by torch or by a loaded library."""
    import torch

    ns, _, cls = name.partition(".")
    try:
        torch._C._get_custom_class_python_wrapper(ns, cls)
    except RuntimeError:
        return False
    return True


def op_schema(op: str) -> str | None:
    """The schema the dispatcher holds for ``op`` (``ns::name[.overload]``), or ``None``."""
    import torch

    name, _, overload = op.partition(".")
    try:
        return str(torch._C._get_schema(name, overload))
    except RuntimeError:
        return None


def kernel_registrations(op: str) -> dict[str, str]:
    """Dispatch key -> where its kernel was registered (``file:line``), for ``op``.

    Read from ``torch._C._dispatch_dump``, the dispatcher's own debug text:
    it lists every key with a kernel registered directly (alias keys such as
    ``Autograd`` included, written ``Autograd[alias]``), which is what
    ``opregistry list --live`` shows.  Fallbacks are not listed.
    """
    import re

    import torch

    try:
        dump = torch._C._dispatch_dump(op)
    except RuntimeError:
        return {}
    found: dict[str, str] = {}
    for line in dump.splitlines():
        match = re.match(r"(\w+)(?:\[alias\])?: registered at (.*?)(?: :: .*)?$", line)
        if match and match.group(1) not in ("debug", "schema", "name"):
            found[match.group(1)] = match.group(2).strip()
    return found


def site_recorded(where: str) -> bool:
    """Whether ``where`` (from :func:`kernel_registrations`) names the file that registered.

    torch 2.13 records the Python ``file:line`` of a ``Library``'s registrations;
    torch 2.8 writes ``/dev/null:LINE`` for every kernel registered from Python,
    whoever registered it -- which says nothing about who did.
    """
    return not where.startswith("/dev/null:")


def destroy_library(library: Any) -> None:
    """Unregister everything ``library`` registered (``Library._destroy``; no public API).

    The ops it defined lose the PyObject dispatch first (see
    :func:`enable_fast_dispatch`): torch 2.15 crashes the process (SIGSEGV)
    when an ``OpOverload`` with it is called after its op was destroyed,
    where the C++ path raises a ``RuntimeError``.
    """
    if _fast_dispatch:
        for qualname in getattr(library, "_op_defs", ()):
            op = _fast_dispatch.pop(qualname, None)
            if op is not None:
                op._enable_pyobj_dispatch(False)
    library._destroy()


def library_alive(library: Any) -> bool:
    """Whether ``library`` still holds its registrations (not destroyed)."""
    return getattr(library, "m", None) is not None


def device_keyset(device_type: str) -> Any:
    """The ``DispatchKeySet`` of a device type (``"cuda"`` -> ``{CUDA}``), to redispatch to."""
    import torch

    key = torch._C._dispatch_key_for_device(device_type)
    return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))


#: ``qualname -> OpOverload`` of the ops opregistry switched to the PyObject dispatch
_fast_dispatch: dict[str, Any] = {}
_FAST_DISPATCH: list[bool] = []  # the feature test, computed once


def fast_dispatch_available() -> bool:
    """Whether this torch offers custom ops the "PyObject dispatch" (torch 2.14+, pytorch#187949).

    Feature-detected, never by version: ``OpOverload._enable_pyobj_dispatch(enabled)``,
    ``_is_pyobj_dispatcher_enabled()``, ``_can_enable_pyobj_dispatch()`` and the
    C++ ``torch._C._dispatch_make_pyobj_dispatch_fns`` must all be there, the
    first taking an ``enabled`` parameter.  ``tests/test_fast_dispatch.py``
    fails if torch has the C++ half but the Python half changed shape.
    """
    if not _FAST_DISPATCH:
        import inspect

        import torch

        overload = torch._ops.OpOverload
        ok = (callable(getattr(torch._C, "_dispatch_make_pyobj_dispatch_fns", None))
              and callable(getattr(overload, "_is_pyobj_dispatcher_enabled", None))
              and callable(getattr(overload, "_can_enable_pyobj_dispatch", None))
              and callable(getattr(overload, "_enable_pyobj_dispatch", None)))
        if ok:
            try:
                ok = "enabled" in inspect.signature(overload._enable_pyobj_dispatch).parameters
            except (TypeError, ValueError):
                ok = False
        _FAST_DISPATCH.append(ok)
    return _FAST_DISPATCH[0]


def enable_fast_dispatch(qualname: str) -> bool:
    """Switch the op ``ns::name[.overload]`` to torch's PyObject dispatch, where torch offers it.

    Calls through its ``OpOverload`` (``torch.ops.ns.name.default(...)``) then
    reach Python kernels without converting every argument to an ``IValue``
    and back: what ``torch.library.custom_op`` does for its own ops.  Calls
    through the packet (``torch.ops.ns.name(...)``) stay on the C++ path, in
    torch as for custom_op.  Returns whether it is on; ``False`` (and nothing
    done) on a torch without it or for an op whose returns are not all
    tensors (torch's own restriction).  :func:`destroy_library` switches it
    off before the op goes away.  Never raises: on any error the op keeps
    the C++ path.
    """
    if qualname in _fast_dispatch:
        return True
    if not fast_dispatch_available():
        return False
    try:
        op = lookup_op(qualname)
        if not op._can_enable_pyobj_dispatch():
            return False
        op._enable_pyobj_dispatch(True)
        if not op._is_pyobj_dispatcher_enabled():
            return False
    except Exception:  # noqa: BLE001 - an optimisation: the C++ path stays, correct
        return False
    _fast_dispatch[op.name()] = op
    return True


def fast_dispatch_enabled() -> frozenset[str]:
    """The ops (``ns::name[.overload]``) opregistry switched to the PyObject dispatch, live."""
    return frozenset(_fast_dispatch)


def lookup_op(qualname: str) -> Any:
    """The ``OpOverload`` for ``ns::name`` or ``ns::name.overload``."""
    import torch._library.utils

    return torch._library.utils.lookup_op(qualname)


def snapshot(mine: Iterable[str] = ()) -> TorchState:
    """The dispatcher's ops and namespaces, less ``mine`` (the ops opregistry registered)."""
    import torch

    mine = frozenset(mine)
    ops = frozenset(op for op in registered_ops() if op not in mine)
    namespaces = frozenset(op.split("::", 1)[0] for op in ops)
    tags = frozenset(name for name in dir(torch.Tag) if not name.startswith("_")) - {"name", "value"}
    return TorchState(ops=ops, namespaces=namespaces, has_kernel=has_kernel, tags=tags,
                      has_class=has_class)


def torch_dir() -> str:
    """The directory of the imported torch package, with a trailing separator."""
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


class Watch:
    """What third-party code registered with torch from Python while it was watched.

    ``libraries`` holds each ``torch.library.Library`` created in the window with
    the ``file:line`` of the code that caused it -- ``None`` when torch created
    it while importing one of its own modules (a plugin importing
    ``torch._inductor``: torch's business, not the plugin's).  ``foreign``
    holds kernels registered in the window through a ``Library`` created
    before it, as ``(library, "ns/name.overload/KEY", file:line)``.
    """

    def __init__(self) -> None:
        self.libraries: list[tuple[Any, str | None]] = []
        self.foreign: list[tuple[Any, str, str | None]] = []
        #: native libraries loaded in the window that registered something:
        #: ``(what was loaded, ops it defined, kernels it replaced, file:line)``
        self.natives: list[tuple[str, frozenset[str], tuple[tuple[str, str, str], ...],
                                 str | None]] = []


class _NativeWindow(threading.local):
    """Per thread: whether a native load is being watched (or planned) already."""

    def __init__(self) -> None:
        self.active = False


_native_window = _NativeWindow()


def _creator(frame: Any, torch_root: str) -> str | None:
    """``file:line`` of the first frame outside torch, or ``None`` if torch's own import made it."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(torch_root):
            frame = frame.f_back
            continue
        if "importlib" in filename:  # a torch module registering at its own import
            return None
        return f"{filename}:{frame.f_lineno}"
    return None


def _importer(frame: Any, torch_root: str) -> str | None:
    """``file:line`` of the first frame outside torch and the import system (who loaded it)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(torch_root) and "importlib" not in filename:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


@contextlib.contextmanager
def watch_registrations() -> Iterator[Watch]:
    """Record the ``Library`` objects created, and the kernels registered, inside the block.

    ``torch._C._dispatch_library`` (what ``Library.__init__`` calls) and
    ``Library.impl`` are wrapped for the duration (process-wide, so another
    thread registering meanwhile is recorded too;
    opregistry's own registrations never happen inside a watched block).

    C++ registrations bypass those, so the two ways Python loads a native
    library are wrapped too: ``torch.ops.load_library`` and the loader of
    extension modules (``importlib.machinery.ExtensionFileLoader.create_module``,
    where the shared library is opened and its ``TORCH_LIBRARY`` blocks run).
    Around each, the dispatcher's op names are compared (~3 ms) and torch's
    warnings about replaced kernels captured (:func:`replaced_kernels`); what
    a library registered lands in ``watch.natives``.  A library an op package
    declares (:func:`load_native`) is checked by the materializer instead, and
    a library loaded while another one is being loaded counts as part of it.
    """
    import torch
    import torch.library as torch_library

    watch = Watch()
    root = torch_dir()
    cls = torch_library.Library
    original_make, original_impl = torch._C._dispatch_library, cls.impl
    created: set[int] = set()

    def recording_make(*args: Any, **kwargs: Any) -> Any:
        # called by Library.__init__, which read its caller's frame already:
        # torch records the real creation site, not this function
        handle = original_make(*args, **kwargs)
        init = sys._getframe(1)
        library = init.f_locals.get("self")
        if isinstance(library, cls):
            created.add(id(library))
            watch.libraries.append((library, _creator(init.f_back, root)))
        return handle

    def recording_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = set(getattr(self, "_op_impls", ()))
        try:
            return original_impl(self, *args, **kwargs)
        finally:
            if id(self) not in created:
                where = _creator(sys._getframe(1), root)
                for entry in sorted(set(getattr(self, "_op_impls", ())) - before):
                    watch.foreign.append((self, entry, where))

    def native(what: str, load: Callable[[], Any]) -> Any:
        if _native_window.active:  # part of a load watched (or planned) already
            return load()
        where = _importer(sys._getframe(2), root)
        before = frozenset(registered_ops())
        _native_window.active = True
        try:
            with replaced_kernels() as replaced:
                return load()
        finally:
            _native_window.active = False
            defined = frozenset(registered_ops()) - before
            if defined or replaced:
                watch.natives.append((what, defined, tuple(replaced), where))

    from importlib.machinery import ExtensionFileLoader

    ops_class = type(torch.ops)
    original_load_library = ops_class.load_library
    original_create = ExtensionFileLoader.create_module

    def recording_load_library(self: Any, path: Any) -> Any:
        return native(f"the shared library {path}",
                      lambda: original_load_library(self, path))

    def recording_create(self: Any, spec: Any) -> Any:
        return native(f"the extension module {spec.name} ({spec.origin})",
                      lambda: original_create(self, spec))

    torch._C._dispatch_library = recording_make
    cls.impl = recording_impl  # type: ignore[method-assign]
    ops_class.load_library = recording_load_library
    ExtensionFileLoader.create_module = recording_create  # type: ignore[method-assign]
    try:
        yield watch
    finally:
        torch._C._dispatch_library = original_make
        cls.impl = original_impl  # type: ignore[method-assign]
        ops_class.load_library = original_load_library
        ExtensionFileLoader.create_module = original_create  # type: ignore[method-assign]


def library_registrations(library: Any) -> tuple[str, frozenset[str], frozenset[str]]:
    """``(namespace, ops defined, kernels)`` of a ``Library``.

    Ops as ``ns::name[.overload]``; kernels as ``"ns/name.overload/KEY"``, what
    ``Library.impl`` records.
    """
    return (library.ns, frozenset(getattr(library, "_op_defs", ())),
            frozenset(getattr(library, "_op_impls", ())))


# -- native libraries (C++ TORCH_LIBRARY blocks) -----------------------------------

#: dispatch keys whose registrations are compared before and after a native library
#: loads: what the library registered for ops it did not declare shows up here
_SCANNED_KEYS = ("CPU", "CUDA", "HIP", "XPU", "MPS", "MTIA", "HPU", "XLA", "Lazy", "PrivateUse1",
                 "Meta", "Autograd", "AutogradCPU", "AutogradCUDA", "AutogradPrivateUse1",
                 "FuncTorchBatched", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
                 "CompositeExplicitAutogradNonFunctional", "BackendSelect", "Functionalize",
                 "ADInplaceOrView", "Python", "SparseCPU", "QuantizedCPU")


def torch_build() -> tuple[str, bool | None, str | None]:
    """The running torch: ``(torch.__version__, C++11 ABI, CUDA version)``."""
    import torch

    abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
    return str(torch.__version__), (None if abi is None else bool(abi)), torch.version.cuda


def load_native(module: str | None, path: str | None) -> tuple[tuple[str, str, str], ...]:
    """Load a native library: import ``module``, or ``torch.ops.load_library(path)``.

    Returns the kernels its static initializers *replaced* (see
    :func:`replaced_kernels`): ``(op, key, where)`` each.
    """
    visible = replacements_visible()
    before = {} if visible else kernel_sites()
    # planned: the materializer compares the whole dispatcher around this load, so a
    # watch around it (guard.run) must not report the library as loaded behind its back
    outer, _native_window.active = _native_window.active, True
    try:
        with replaced_kernels() as replaced:
            if module is not None:
                import importlib

                importlib.import_module(module)
            else:
                import torch

                torch.ops.load_library(path)
    finally:
        _native_window.active = outer
    if not visible:  # the warnings are hidden: compare every op's kernels (slow, ~0.5 s each)
        replaced.extend((op, key, site) for (op, key), site in sorted(kernel_sites().items())
                        if before.get((op, key), site) != site)
    return tuple(replaced)


def kernel_sites() -> dict[tuple[str, str], str]:
    """``(op, key)`` -> where its kernel was registered, for every op torch knows (slow)."""
    return {(op, key): site for op in registered_ops()
            for key, site in kernel_registrations(op).items()}


#: the start of the C++ warning torch's dispatcher gives when a registration replaces a
#: kernel already registered for the same (op, key) (OperatorEntry::registerKernel)
_REPLACING = "Overriding a previously registered kernel for the same operator"
_REPLACING_FIRST = "Warning only once for all operators"
#: C++ log levels (TORCH_CPP_LOG_LEVEL) that hide warnings
_QUIET_LEVELS = frozenset({"2", "3", "ERROR", "FATAL"})
_capture_lock = threading.Lock()


@contextlib.contextmanager
def replaced_kernels() -> Iterator[list[tuple[str, str, str]]]:
    """Collect the kernels C++ registrations made meanwhile replace: ``(op, key, where)``.

    A registration for an (op, key) that already has a kernel pushes the old
    one down and makes torch's dispatcher warn ("Overriding a previously
    registered kernel ...", naming operator, key and both sites), once per
    process (``TORCH_WARN_ONCE``) unless ``torch.set_warn_always(True)``.  While
    a native library loads, that is on, and the warnings -- which C++ code
    outside any torch binding writes to file descriptor 2 -- are read from a
    temporary file put there; everything else written meanwhile is written back
    to the real stderr afterwards.  Meta kernels are not warned about (torch
    replaces C++ meta kernels by Python ones routinely) and so not seen; nor
    is anything when ``TORCH_CPP_LOG_LEVEL`` hides warnings (:func:`replacements_visible`).
    """
    import tempfile

    import torch

    found: list[tuple[str, str, str]] = []
    with _capture_lock:
        was = torch.is_warn_always_enabled()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr to redirect: nothing is seen
            yield found
            return
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), 2)
            torch.set_warn_always(True)
            try:
                yield found
            finally:
                torch.set_warn_always(was)
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                capture.seek(0)
                text = capture.read().decode(errors="replace")
                rest = _parse_replacements(text, found)
                if rest:
                    os.write(2, rest.encode())


def _parse_replacements(text: str, found: list[tuple[str, str, str]]) -> str:
    """Append each replacement warning of ``text`` to ``found``; the rest of ``text``."""
    rest: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if _REPLACING_FIRST not in line and _REPLACING not in line:
            rest.append(line)
            i += 1
            continue
        block = [line]
        i += 1
        while i < len(lines) and lines[i][:1] in (" ", "\t"):
            block.append(lines[i])
            i += 1
        fields: dict[str, str] = {}
        for entry in block:
            name, sep, value = entry.strip().partition(": ")
            if sep and name in ("operator", "dispatch key", "new kernel"):
                fields.setdefault(name, value.strip())
        op = fields.get("operator", "").partition("(")[0]
        if op and "dispatch key" in fields:
            where = fields.get("new kernel", "")
            where = where[len("registered at "):] if where.startswith("registered at ") else where
            found.append((op, fields["dispatch key"], where.partition(" (")[0]))
        else:  # not the shape this torch is known to write: keep it for the user
            rest.extend(block)
    return "".join(rest)


def replacements_visible() -> bool:
    """Whether :func:`replaced_kernels` can see anything: C++ warnings are not hidden."""
    return os.environ.get("TORCH_CPP_LOG_LEVEL", "").strip().upper() not in _QUIET_LEVELS


def dispatcher_registrations() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """Every op torch knows, and the ops with a kernel at each scanned key.

    Taken before and after a native library loads: the difference is what its
    static initializers registered (C++ registrations bypass every Python hook;
    :func:`new_kernels` gives the new ``(op, key)`` pairs).  A kernel that
    replaces one already registered for the same (op, key) leaves both as they
    were: :func:`load_native` reports those (:func:`replaced_kernels`).
    """
    import torch

    per_key = {}
    for key in _SCANNED_KEYS:
        try:
            per_key[key] = frozenset(torch._C._dispatch_get_registrations_for_dispatch_key(key))
        except RuntimeError:  # a key this torch does not have
            continue
    return frozenset(registered_ops()), per_key


def new_kernels(before: dict[str, frozenset[str]], after: dict[str, frozenset[str]]
                ) -> frozenset[tuple[str, str]]:
    """The ``(op, key)`` pairs of ``after`` that ``before`` lacks.

    ``before`` and ``after`` are the second results of two
    :func:`dispatcher_registrations`.

    Compared key by key: the sets of ~2,000 aten ops per key stay sets of
    names, never ~30,000 pairs built twice per native library.
    """
    return frozenset((op, key) for key, ops in after.items()
                     for op in ops - before.get(key, frozenset()))


def normal_schema(schema: str) -> str:
    """``schema`` as torch prints it (``torch._C.parse_schema``), to compare two spellings."""
    import torch

    try:
        return str(torch._C.parse_schema(schema))
    except RuntimeError:
        return " ".join(schema.split())


def definition_site(op: str) -> str | None:
    """Where ``op`` (``ns::name[.overload]``) was defined, ``file:line``; ``None`` if unknown."""
    import torch

    name, _, overload = op.partition(".")
    try:
        debug = torch._C._dispatch_find_schema_or_throw(name, overload).debug()
    except RuntimeError:
        return None
    return debug[len("registered at "):] if debug.startswith("registered at ") else debug
