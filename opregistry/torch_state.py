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
import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple, NoReturn

if TYPE_CHECKING:  # imported by snapshot(): the recorder alone needs no records
    from .environment import TorchState
from .state import process

__all__ = ["snapshot", "registered_ops", "has_kernel", "has_class", "op_schema",
           "kernel_registrations", "destroy_library", "forget_destroyed_kernels", "new_library",
           "undo_library",
           "library_alive", "device_keyset", "lookup_op",
           "Watch", "Registration", "Recorder", "recorder", "registering", "watch_registrations",
           "torch_dir",
           "torch_build", "torch_importing_alone", "load_native", "dispatcher_registrations",
           "new_kernels", "normal_schema",
           "definition_site", "fast_dispatch_available", "enable_fast_dispatch",
           "fast_dispatch_enabled", "site_recorded", "eager_triton", "functional_tensor_mode",
           "traceable_tensor_type", "triton_decomposition_disabled", "install_ops_hooks",
           "uninstall_ops_hooks", "add_note"]


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
    fast = process().fast_dispatch
    if fast:
        for qualname in getattr(library, "_op_defs", ()):
            op = fast.pop(qualname, None)
            if op is not None:
                op._enable_pyobj_dispatch(False)
    library._destroy()


def forget_destroyed_kernels() -> None:
    """Drop the device kernels (``ProcessState.device_kernels``) of destroyed libraries.

    :func:`opregistry.backend.device_kernel` forgets such an entry when asked
    for it; after an unload nothing asks, and the entries (three objects per
    kernel) would stay to the end of the process.
    """
    table = process().device_kernels
    for found in [k for k, (ref, _) in table.items()
                  if (lib := ref()) is None or not library_alive(lib)]:
        del table[found]


def new_library(namespace: str, kind: str, site: str | None = None) -> Any:
    """A ``torch.library.Library`` whose registrations torch records at ``site`` (``file:line``).

    ``Library.__init__`` records the ``file:line`` of its caller, and torch
    names it in its own messages ("registered multiple times ... Original
    registration: registered at ..."), in ``_dispatch_dump`` and in kernel
    replacement warnings.  Created from a one-line code object carrying the
    op package's file name and line, the library is recorded at the
    declaration that asked for it, not inside opregistry; without a usable
    ``site``, at the caller.
    """
    from torch.library import Library

    filename, _, line = (site or "").rpartition(":")
    if not filename or not line.isdigit() or int(line) < 1:
        return Library(namespace, kind)
    scope = {"Library": Library, "namespace": namespace, "kind": kind}
    exec(_code_at(filename, int(line)), scope)  # noqa: S102 - our own one line (_LIBRARY_AT)
    return scope["library"]


#: the call :func:`new_library` runs, compiled once: from a frame of the site's line, and so
#: is its caller -- torch 2.13 records the caller's ``file:line``, torch 2.8
#: ``/dev/null:LINE`` with the line two frames up
_LIBRARY_AT = compile("library = (lambda: Library(namespace, kind))()", "<opregistry>", "exec")


def _code_at(filename: str, line: int) -> Any:
    """:data:`_LIBRARY_AT` moved to ``filename:line``, the lambda within it too.

    ``CodeType.replace`` keeps the line table, which is relative to the first
    line: every instruction is then at ``line``.  Compiling the line anew for
    each library cost far more (a thousand op packages are a thousand libraries).
    """
    consts = tuple(c.replace(co_filename=filename, co_firstlineno=line)
                   if isinstance(c, type(_LIBRARY_AT)) else c for c in _LIBRARY_AT.co_consts)
    return _LIBRARY_AT.replace(co_filename=filename, co_firstlineno=line, co_consts=consts)


def undo_library(handle: Any, libraries: Iterable[Any] = ()) -> None:
    """Unregister what a ``Library`` registered: destroy it, or reset its C++ handle.

    ``handle`` is the C++ library a ``Library`` holds (its ``.m``);
    ``libraries`` the ``Library`` objects seen using it, if any (a bare
    ``Library(ns, "DEF")`` is only known by its handle).
    """
    library = next((lib for lib in libraries if getattr(lib, "m", None) is handle), None)
    if library is not None:
        destroy_library(library)
    elif handle is not None:
        handle.reset()


def library_alive(library: Any) -> bool:
    """Whether ``library`` still holds its registrations (not destroyed)."""
    return getattr(library, "m", None) is not None


def device_keyset(device_type: str) -> Any:
    """The ``DispatchKeySet`` of a device type (``"cuda"`` -> ``{CUDA}``), to redispatch to."""
    import torch

    key = torch._C._dispatch_key_for_device(device_type)
    return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))


@functools.lru_cache(maxsize=1)  # a fact of the imported torch: computed once
def fast_dispatch_available() -> bool:
    """Whether this torch offers custom ops the "PyObject dispatch" (torch 2.14+, pytorch#187949).

    Feature-detected, never by version: ``OpOverload._enable_pyobj_dispatch(enabled)``,
    ``_is_pyobj_dispatcher_enabled()``, ``_can_enable_pyobj_dispatch()`` and the
    C++ ``torch._C._dispatch_make_pyobj_dispatch_fns`` must all be there, the
    first taking an ``enabled`` parameter.  ``tests/test_fast_dispatch.py``
    fails if torch has the C++ half but the Python half changed shape.
    """
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
    return ok


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
    fast = process().fast_dispatch
    if qualname in fast:
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
    fast[op.name()] = op
    return True


def fast_dispatch_enabled() -> frozenset[str]:
    """The ops (``ns::name[.overload]``) opregistry switched to the PyObject dispatch, live."""
    return frozenset(process().fast_dispatch)


def lookup_op(qualname: str) -> Any:
    """The ``OpOverload`` for ``ns::name`` or ``ns::name.overload``."""
    import torch._library.utils

    return torch._library.utils.lookup_op(qualname)


def snapshot(mine: Iterable[str] = ()) -> TorchState:
    """The dispatcher's ops and namespaces, less ``mine`` (the ops opregistry registered) and
    those torch defines after the autoload (:data:`~opregistry.keys.LATE_NAMESPACES`)."""
    import torch

    from .keys import LATE_NAMESPACES

    mine = frozenset(mine)
    ops = frozenset(op for op in registered_ops() if op not in mine
                    and op.partition("::")[0] not in LATE_NAMESPACES)
    namespaces = frozenset(op.split("::", 1)[0] for op in ops)
    tags = frozenset(name for name in dir(torch.Tag) if not name.startswith("_")) - {"name", "value"}
    from .environment import TorchState

    return TorchState(ops=ops, namespaces=namespaces, has_kernel=has_kernel, tags=tags,
                      has_class=has_class)


def torch_dir() -> str:
    """The directory of the imported torch package, with a trailing separator."""
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


class Watch:
    """What third-party code registered with torch from Python, in one thread, while watched.

    ``created`` holds each ``torch.library.Library`` created in the window, as
    ``(handle, namespace, kind, file:line)`` -- the ``file:line`` of the code
    that caused it, ``None`` when torch created it while importing one of its
    own modules (a plugin importing ``torch._inductor``: torch's business);
    ``handle`` is the C++ library the ``Library`` holds (its ``.m``), the
    registering object.  ``events`` holds every registration made meanwhile,
    as :class:`Registration` records.  ``natives`` holds the native libraries
    loaded that registered something: ``(what was loaded, ops it defined,
    kernels it replaced, file:line)``.
    """

    def __init__(self) -> None:
        self.created: list[tuple[Any, str, str, str | None]] = []
        self.events: list[Registration] = []
        self.natives: list[tuple[str, frozenset[str], tuple[tuple[str, str, str], ...],
                                 str | None]] = []

    def made(self, registration: Registration) -> bool:
        """Whether ``registration`` went through a ``Library`` created in this window."""
        return any(registration.handle is handle for handle, *_ in self.created)


class Registration(NamedTuple):
    """One registration a ``Library`` made: which op, which slot, from where, through which library.

    ``slot`` is ``"schema"`` for a definition, the dispatch key for a kernel,
    ``"Fake"`` for a fake kernel, ``"TorchDispatch[module:Class]"`` for a
    torch_dispatch rule.  ``site`` is the ``file:line`` of the first frame
    outside torch (``None``: torch's own import).
    """

    op: str
    slot: str
    site: str | None
    library: Any
    handle: Any


#: opregistry's own files: a registration torch makes while opregistry calls it (lazily
#: registering an op opregistry looks up) is not opregistry's caller's
_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: the standard library's files (functools' dispatch wrappers around torch.library.define):
#: machinery between torch and the code that called it
_STDLIB = os.path.dirname(os.path.abspath(contextlib.__file__)) + os.sep


def _creator(frame: Any, torch_root: str) -> str | None:
    """``file:line`` of the first frame outside torch, or ``None`` if torch's own import made it."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if "importlib" in filename or filename.startswith(_OWN):
            # a torch module registering at its own import, or when opregistry asks for it
            return None
        if filename.startswith(torch_root) or (filename.startswith(_STDLIB)
                                               and "site-packages" not in filename):
            frame = frame.f_back
            continue
        return f"{filename}:{frame.f_lineno}"
    return None


def _name_the_holder(exc: RuntimeError, kind: str, ns: str) -> None:
    """Name the op package whose namespace a package's own ``Library`` clashed with.

    torch's message names the line of the first registration, and only on
    torch 2.13+ (2.8 writes ``/dev/null:LINE``); neither names a distribution.
    """
    holder = process().namespace_holders.get(ns)
    if (holder is None or kind == "IMPL" or process().thread.registering
            or "TORCH_LIBRARY" not in str(exc)):
        return
    add_note(exc, f"opregistry: namespace {ns!r} is defined by the op package {holder}, "
                  f"materialized at `import torch`; this package defines it too. Only one can: "
                  f"uninstall one of them, or block the op package "
                  f"(OPREGISTRY_BLOCK={holder.partition('==')[0]}).")


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10, which has no notes, the note ends the message."""
    add = getattr(exc, "add_note", None)
    if callable(add):
        add(note)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n{note}", *exc.args[1:])


def _importer(frame: Any, torch_root: str) -> str | None:
    """``file:line`` of the first frame outside torch and the import system (who loaded it)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(torch_root) and "importlib" not in filename:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _qualname(library: Any, op: Any) -> str:
    """``ns::name[.overload]`` of what a ``Library`` method was given: a name, or an OpOverload."""
    if isinstance(op, str):
        name = op.partition("(")[0].strip()
        return name if "::" in name else f"{library.ns}::{name}"
    name = getattr(op, "name", None)
    return name() if callable(name) else f"{library.ns}::{op!r}"


def _class_name(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', repr(cls))}"


#: Library method -> (the slot it fills, from its arguments); the op is its first argument
_SLOTS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], str]] = {
    "define": lambda a, k: "schema",
    "impl": lambda a, k: (a[2] if len(a) > 2 else k.get("dispatch_key", "")) or
    "CompositeImplicitAutograd",
    "_register_fake": lambda a, k: "Fake",
    "_register_torch_dispatch_rule": lambda a, k: "TorchDispatch[" + _class_name(
        a[1] if len(a) > 1 else k.get("torch_dispatch_class")) + "]",
    "_impl_with_aoti_compile": lambda a, k: (a[1] if len(a) > 1 else
                                             k.get("dispatch_key", "")) or "CompositeImplicitAutograd",
}


#: Library methods whose ``_stacklevel`` argument (3rd) says where torch reads the
#: registering line (``torch._library.utils.get_source``)
_STACKLEVEL = {"_register_fake": 2}


def _one_frame_deeper(args: tuple[Any, ...], kwargs: dict[str, Any]
                      ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``_register_fake``'s arguments with ``_stacklevel`` one frame deeper (this wrapper's)."""
    index = _STACKLEVEL["_register_fake"]
    if len(args) > index:
        return (*args[:index], args[index] + 1, *args[index + 1:]), kwargs
    return args, {**kwargs, "_stacklevel": kwargs.get("_stacklevel", 1) + 1}


class Recorder:
    """Records every registration Python code makes through ``torch.library.Library``.

    Installed once per process (:func:`recorder`), when opregistry first loads
    or watches: ``Library``'s registration methods and the C++ call behind
    ``Library(...)`` are wrapped, so that each registration is known by the
    registering object (the ``Library``, its C++ handle) and the thread that
    made it -- never by reading another frame's locals.  Each is noted in
    :attr:`sites` (``(op, slot) -> file:line`` of the code outside torch that
    made it: how ``list --live`` names the distribution of a package that
    registers with ``torch.library`` directly) and in the watches open on the
    registering thread (:func:`watch_registrations`).  Registrations opregistry
    makes itself (:func:`registering`) and those torch makes while importing
    its own modules are not noted.
    """

    def __init__(self) -> None:
        self.sites: dict[tuple[str, str], str] = {}
        #: namespace -> Library kind -> file:line of the first DEF / FRAGMENT made outside torch
        self.namespaces: dict[str, dict[str, str]] = {}
        self._originals: dict[str, Any] = {}
        self._root = ""
        #: ``Library.impl`` calls for which this returns true are not made: the kernel
        #: switches of adopted packages (opregistry.adopting), applied as they register
        self.veto: Callable[[Registration], bool] | None = None

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def install(self) -> None:
        import torch
        import torch.library as torch_library

        if self._originals:
            return
        self._root = torch_dir()
        cls = torch_library.Library
        self._originals["_dispatch_library"] = original_make = torch._C._dispatch_library

        def recording_make(kind: str, ns: str, *args: Any, **kwargs: Any) -> Any:
            try:
                handle = original_make(kind, ns, *args, **kwargs)
            except RuntimeError as exc:
                _name_the_holder(exc, kind, ns)
                raise
            self._created(handle, ns, kind, sys._getframe(2))
            return handle

        torch._C._dispatch_library = recording_make
        for method in _SLOTS:
            original = getattr(cls, method, None)
            if original is not None:
                self._originals[method] = original
                setattr(cls, method, self._wrap(method, original))

    def uninstall(self) -> None:
        import torch
        import torch.library as torch_library

        make = self._originals.pop("_dispatch_library", None)
        if make is not None:
            torch._C._dispatch_library = make
        for method, original in self._originals.items():
            setattr(torch_library.Library, method, original)
        self._originals.clear()

    def _wrap(self, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        slot_of = _SLOTS[method]
        # torch reads its caller's line this many frames up: one more through this wrapper
        deeper = method in _STACKLEVEL

        def recording(library: Any, *args: Any, **kwargs: Any) -> Any:
            thread = process().thread
            if deeper:
                args, kwargs = _one_frame_deeper(args, kwargs)
            if thread.registering:  # opregistry's own: neither vetoed nor noted
                return original(library, *args, **kwargs)
            if self.veto is not None and method == "impl" and args:
                vetoed = self._vetoed(library, args, kwargs, slot_of)
                if vetoed:
                    return None
            result = original(library, *args, **kwargs)
            if args:
                self._note(Registration(_qualname(library, args[0]),
                                        slot_of(args, kwargs),
                                        _creator(sys._getframe(1), self._root),
                                        library, getattr(library, "m", None)), thread)
            return result

        recording.__wrapped__ = original  # type: ignore[attr-defined]
        recording.__name__ = recording.__qualname__ = method
        return recording

    def _vetoed(self, library: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                slot_of: Callable[[tuple[Any, ...], dict[str, Any]], str]) -> bool:
        """Whether :attr:`veto` refuses this ``Library.impl`` (a kernel a switch turns off)."""
        if process().thread.registering or self.veto is None:
            return False
        registration = Registration(_qualname(library, args[0]), slot_of(args, kwargs),
                                    _creator(sys._getframe(2), self._root), library,
                                    getattr(library, "m", None))
        return bool(self.veto(registration))

    def _created(self, handle: Any, ns: str, kind: str, frame: Any) -> None:
        thread = process().thread
        if thread.registering:
            return
        site = _creator(frame, self._root)
        if site is not None and kind != "IMPL":
            self.namespaces.setdefault(ns, {}).setdefault(kind, site)
        for watch in thread.watches:
            watch.created.append((handle, ns, kind, site))

    def _note(self, registration: Registration, thread: Any) -> None:
        if registration.site is not None:
            self.sites[(registration.op, registration.slot)] = registration.site
        for watch in thread.watches:
            watch.events.append(registration)
        waiting = process().after_registration
        if waiting:  # an override opregistry holds back until the package registered its own
            for callback in waiting.pop((registration.op, registration.slot), ()):
                callback()



class _Registering:
    """The context manager :func:`registering` returns (a class: it is entered per registration)."""

    __slots__ = ("thread", "outer", "importing")

    def __enter__(self) -> None:
        self.thread = thread = process().thread
        self.outer, thread.registering = thread.registering, True
        self.importing = importing = torch_importing_alone()
        if importing is not None:
            importing._initializing = False

    def __exit__(self, *exc: Any) -> None:
        self.thread.registering = self.outer
        if self.importing is not None:
            self.importing._initializing = True


def torch_importing_alone() -> Any:
    """torch's module spec while ``import torch`` runs and no other Python thread exists; else ``None``.

    Inside ``import torch`` (opregistry's autoload) torch's module is marked
    initializing, and each ``import torch`` torch's own registration code
    makes -- one per ``Library.impl`` (from C++) and one per fake kernel
    registered -- then takes and gives back torch's module import lock: ~3 us each,
    0.1-0.2 s over 40,000 registrations, which registering after ``import
    torch`` does not pay.  The importing thread holds that lock already (it is
    re-entrant); the mark only makes *other* threads wait for a complete
    torch.  With no other Python thread alive nobody can wait, so
    :func:`registering` (and its inlined copy in the materializer) clears the
    mark around each of opregistry's own registrations and sets it back: the
    same imports, without the lock.
    """
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    if getattr(spec, "_initializing", False) and threading.active_count() == 1:
        return spec
    return None


def registering() -> _Registering:
    """Registrations opregistry makes itself, on this thread: not noted by the :class:`Recorder`."""
    return _Registering()


def recorder() -> Recorder:
    """The process's :class:`Recorder`, installed (imports torch)."""
    state = process()
    if state.recorder is None:
        state.recorder = Recorder()
    state.recorder.install()
    return state.recorder


@contextlib.contextmanager
def watch_registrations() -> Iterator[Watch]:
    """What the code run inside the block registers with torch, on this thread.

    Python registrations come from the :class:`Recorder` (installed if it was
    not).  C++ registrations bypass it, so the two ways Python loads a native
    library are wrapped for the duration too: ``torch.ops.load_library`` and
    the loader of extension modules
    (``importlib.machinery.ExtensionFileLoader.create_module``, where the shared
    library is opened and its ``TORCH_LIBRARY`` blocks run).  Around each, the
    dispatcher's op names are compared (~3 ms) and torch's warnings about
    replaced kernels captured (:func:`replaced_kernels`); what a library
    registered lands in ``watch.natives``.  A library an op package declares
    (:func:`load_native`) is checked by the materializer instead, and a
    library loaded while another one is being loaded counts as part of it.
    A load on another thread is not this block's.
    """
    recorder()
    watch = Watch()
    thread = process().thread
    thread.watches.append(watch)
    try:
        with _native_loads_watched():
            yield watch
    finally:
        thread.watches.remove(watch)


_native_lock = threading.Lock()
_native_users: list[int] = [0]


@contextlib.contextmanager
def _native_loads_watched() -> Iterator[None]:
    """Wrap the two ways Python loads a native library while any thread watches."""
    import torch
    from importlib.machinery import ExtensionFileLoader

    ops_class = type(torch.ops)
    with _native_lock:
        _native_users[0] += 1
        if _native_users[0] == 1:
            original_load, original_create = ops_class.load_library, ExtensionFileLoader.create_module
            ops_class.load_library = lambda self, path: _native_load(
                f"the shared library {path}", lambda: original_load(self, path))
            ExtensionFileLoader.create_module = lambda self, spec: _native_load(  # type: ignore
                f"the extension module {spec.name} ({spec.origin})",
                lambda: original_create(self, spec))
            ops_class.load_library.__wrapped__ = original_load
            ExtensionFileLoader.create_module.__wrapped__ = original_create  # type: ignore
    try:
        yield
    finally:
        with _native_lock:
            _native_users[0] -= 1
            if _native_users[0] == 0:
                ops_class.load_library = ops_class.load_library.__wrapped__
                ExtensionFileLoader.create_module = (  # type: ignore[method-assign]
                    ExtensionFileLoader.create_module.__wrapped__)  # type: ignore[attr-defined]


def _native_load(what: str, load: Callable[[], Any]) -> Any:
    """``load()``, noting in this thread's watches what the native library registered."""
    thread = process().thread
    if thread.native_load or not thread.watches:  # part of a load watched, or not watched
        return load()
    where = _importer(sys._getframe(2), torch_dir())
    before = frozenset(registered_ops())
    thread.native_load = True
    try:
        with replaced_kernels() as replaced:
            return load()
    finally:
        thread.native_load = False
        defined = frozenset(registered_ops()) - before
        if defined or replaced:
            for watch in thread.watches:
                watch.natives.append((what, defined, tuple(replaced), where))


# -- lookups through torch.ops (lazy adoption) ------------------------------------


def install_ops_hooks() -> bool:
    """Route the first touch of ``torch.ops.<ns>``, and a missing op, to the process's adopter.

    torch creates ``torch.ops.<ns>`` in ``type(torch.ops).__getattr__`` (``_Ops``)
    on its first touch and caches it on ``torch.ops``; an op is looked up in
    ``_OpNamespace.__getattr__``, which raises ``AttributeError`` when the
    dispatcher has no such op, and caches what it finds.  Both are wrapped
    once per process: before torch creates a namespace, ``process().adopter``
    (:class:`opregistry.adopting.Adopter`) imports what registers it; when an
    op is missing, what defines it, then the lookup is tried again.  Lookups
    torch has cached never come here, and with no adopter the wrappers pass
    through.  Returns whether the hooks are installed (``False``: this torch
    has another shape; nothing is adopted lazily).
    """
    import torch

    ops_class = type(torch.ops)
    namespace_class = _namespace_class()
    if getattr(ops_class.__getattr__, "__opregistry_hook__", False):
        return True
    if namespace_class is None or "__getattr__" not in vars(ops_class) \
            or "__getattr__" not in vars(namespace_class):
        return False
    original_ns, original_op = ops_class.__getattr__, namespace_class.__getattr__

    def namespace_getattr(self: Any, name: str) -> Any:
        adopter = process().adopter
        if adopter is not None and name in adopter.namespaces:
            adopter.namespace_touched(name)  # imports, or waits for another thread's import
            # the adopter that imported: this one, or the loaded registry's that a waiting
            # adopter (opregistry.autoload) handed over to
            current = process().adopter
            holds = getattr(current, "holds", None)
            if holds is not None and current.importing(name):
                # this thread is inside the package's import (opregistry's or its user's), and
                # the package touches its own namespace: made once, not cached in torch.ops
                # until the import is done (NamespaceHolds)
                def make() -> Any:
                    made = original_ns(self, name)
                    vars(self).pop(name, None)
                    return made
                return holds.hold(name, make)
            found = vars(self).get(name)
            if found is not None:
                return found
            held = holds.release(name) if holds is not None else None
            if held is not None:  # made while the package was imported: cached now
                setattr(self, name, held)
                return held
        return original_ns(self, name)

    def op_getattr(self: Any, op_name: str) -> Any:
        try:
            return original_op(self, op_name)
        except AttributeError as missing:
            adopter = process().adopter
            if adopter is None:
                raise
            if not adopter.op_missing(self.name, op_name):
                _explain(self.name, missing)
        # what defines the op imported: asked again; still missing (the module defines it
        # only under a condition, or the package around it failed), it says why all the same
        try:
            return original_op(self, op_name)
        except AttributeError as missing:
            _explain(self.name, missing)

    for wrapper, original in ((namespace_getattr, original_ns), (op_getattr, original_op)):
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__opregistry_hook__ = True  # type: ignore[attr-defined]
        wrapper.__name__ = wrapper.__qualname__ = "__getattr__"
    ops_class.__getattr__ = namespace_getattr
    namespace_class.__getattr__ = op_getattr
    return True


def _explain(namespace: str, missing: AttributeError) -> NoReturn:
    """Raise ``missing`` (torch's ``AttributeError`` for an op of ``namespace``), with why
    the op may be missing where an adopted package says so (its import failed, the lock
    refused it): an ``AttributeError`` still, so ``hasattr`` stays ``False``."""
    # asked here: a waiting adopter may have just handed over to the loaded registry's
    why = getattr(process().adopter, "why_missing", lambda _: None)(namespace)
    if why is None:
        raise missing
    explained = AttributeError(f"{missing}: {why}")
    explained.name, explained.obj = missing.name, missing.obj
    raise explained from missing


def uninstall_ops_hooks() -> None:
    """Undo :func:`install_ops_hooks` (for tests)."""
    import torch

    for cls in (type(torch.ops), _namespace_class()):
        hook = vars(cls).get("__getattr__") if cls is not None else None
        if hook is not None and getattr(hook, "__opregistry_hook__", False):
            cls.__getattr__ = hook.__wrapped__  # type: ignore[union-attr]


def _namespace_class() -> type | None:
    """torch's class of ``torch.ops.<ns>`` objects (``torch._ops._OpNamespace``)."""
    import torch._ops

    cls = getattr(torch._ops, "_OpNamespace", None)
    return cls if isinstance(cls, type) else None


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
    thread = process().thread
    outer, thread.native_load = thread.native_load, True
    try:
        with replaced_kernels() as replaced:
            if module is not None:
                import importlib

                importlib.import_module(module)
            else:
                import torch

                torch.ops.load_library(path)
    finally:
        thread.native_load = outer
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


# -- Triton kernels (torch.library.triton_op semantics) ----------------------------


def eager_triton(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with ``wrap_triton`` switched off: real tensors need no tracing.

    The device kernel of a Triton kernel, and a Triton candidate in a chain of
    kernel candidates (which, being chosen per call, gets no ``FunctionalTensorMode``
    rule: ``torch.compile`` keeps such an op whole and uses its fake kernel).
    """
    from torch._library.triton import set_wrap_triton_enabled

    def triton_device_kernel(*args: Any, **kwargs: Any) -> Any:
        with set_wrap_triton_enabled(False):
            return fn(*args, **kwargs)

    triton_device_kernel.__qualname__ = triton_device_kernel.__name__ = getattr(
        fn, "__name__", "triton_kernel")
    return triton_device_kernel


def functional_tensor_mode() -> type:
    """``FunctionalTensorMode``, the mode AOTDispatcher traces under (``torch.compile``)."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    return FunctionalTensorMode


def traceable_tensor_type(cls: type) -> bool:
    """Whether a tensor of type ``cls`` can run a Triton kernel's function under tracing."""
    import torch
    from torch._subclasses import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return issubclass(cls, FakeTensor) or cls in (torch.Tensor, FunctionalTensor)


def triton_decomposition_disabled() -> bool:
    """Whether ``torch.export`` is tracing, which keeps Triton ops whole."""
    from torch.export._trace import custom_triton_ops_decomposition_disabled

    return bool(custom_triton_ops_decomposition_disabled())
