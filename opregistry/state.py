"""Process state: everything opregistry keeps for the life of a process, in one owner.

opregistry registers with torch, which is process-wide: what it registered,
the registry that did it and the tables its kernels read at call time live
as long as those registrations.  They are held by one :class:`ProcessState`,
:func:`process`, rather than by module-level tables scattered over the
modules that fill them, so that their lifetime is visible and a test can
end it:

* created empty when opregistry is imported;
* filled by :func:`opregistry.load` (at ``import torch``): the registry, the
  ops defined, the device kernels and Triton kernels registered, ops on the
  fast dispatch path;
* emptied of what a registry registered by :meth:`opregistry.Registry.unload`
  (and ``load(reload=True)``, which unloads first);
* replaced whole by :func:`reset` -- for tests, after every registry is
  unloaded: torch's dispatcher is not reset with it.

Where a table indexes torch objects (``Library`` objects, ``OpOverload``
packets), it holds them weakly or is keyed by a name torch owns, so that a
destroyed ``Library`` does not stay alive through opregistry.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from typing import Any, Callable, Iterator

__all__ = ["ProcessState", "process", "reset", "gc_paused"]


class _PerThread(threading.local):
    """Flags that belong to one thread: a native load being watched, a watch in progress."""

    def __init__(self) -> None:
        self.native_load = False
        #: open registration watches (opregistry.torch_state.watch_registrations)
        self.watches: list[Any] = []
        #: opregistry itself is registering (its own registrations are not recorded)
        self.registering = False
        #: per guard.run of code that may import torch: the watch torch's arrival starts
        #: (opregistry.guard.torch_arrived), innermost last
        self.torch_watches: list[list[Any]] = []


class ProcessState:
    """The one owner of opregistry's process-wide state (see the module docstring)."""

    #: whether the last load registered a cached plan's program (opregistry.program):
    #: ``False`` after a load that registered the plan itself
    plan_replayed = False

    def __init__(self) -> None:
        #: serializes load / unload / plan; re-entrant (a load completes deferred plugins)
        self.lock = threading.RLock()
        #: the registry :func:`opregistry.load` returned, ``None`` before or after unload
        self.registry: Any = None
        #: whether plugins are being imported (a plugin calling load() then is refused)
        self.loading = False
        #: ops defined through opregistry by a live registry (``ns::name[.overload]``)
        self.defined: set[str] = set()
        #: module name -> what waits for its import to finish (opregistry.imports)
        self.after_import: dict[str, list[Callable[[Any], None]]] = {}
        #: ``(op, slot)`` -> what waits for a package to register it (the Recorder runs it
        #: right after the package's own registration)
        self.after_registration: dict[tuple[str, str], list[Callable[[], None]]] = {}
        #: problems of registrations made after the load (a kernel for a package's op,
        #: registered once the package is imported)
        self.late_problems: list[Any] = []
        #: the ``file:line`` torch records for opregistry's own ``Library`` objects (their
        #: declarations'): a kernel registered there is opregistry's, not a replacement
        self.library_sites: set[str] = set()
        #: namespace -> who DEFs it through opregistry (``"dist==1.0 (file:line)"``):
        #: named when a package's own ``Library`` for it is refused by torch
        self.namespace_holders: dict[str, str] = {}
        #: ``(qualname, key) -> (weak Library, fn)``: device kernels DeviceBackends registered
        self.device_kernels: dict[tuple[str, str], tuple[weakref.ref, Callable[..., Any]]] = {}
        #: ``Library -> {qualname: {device type: fn}}``: Triton kernels per library and op
        self.triton_kernels: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = (
            weakref.WeakKeyDictionary())
        #: ``qualname -> OpOverload`` of the ops switched to torch's PyObject dispatch
        self.fast_dispatch: dict[str, Any] = {}
        #: kernel counts: (op, key, label) -> calls; (op, key) -> calls a later candidate served
        self.calls: dict[tuple[str, str, str], int] = {}
        self.fallbacks: dict[tuple[str, str], int] = {}
        #: open ``kernel_counts()`` blocks (the next load registers counting while > 0)
        self.counting_blocks = 0
        #: counting kernels and chains registered so far (a block that saw it grow loaded
        #: counting, whatever earlier loads in the process did)
        self.counting_registered = 0
        #: the atexit handlers made: the counts table, the unload (opregistry.registry)
        self.counts_printed_at_exit = self.unload_at_exit = False
        #: a real SIGINT arrived while third-party code ran (opregistry.containment)
        self.interrupted = threading.Event()
        self.interrupt_depth, self.interrupt_lock = 0, threading.Lock()
        #: per-thread flags (opregistry.torch_state's registration watch)
        self.thread = _PerThread()
        #: the wrapper of torch.library.Library's registration methods (installed once,
        #: when opregistry first loads or watches; opregistry.torch_state.Recorder)
        self.recorder: Any = None
        #: what the first touch of torch.ops.<ns> imports: the loaded registry's adoptions
        #: (opregistry.adopting.Adopter; None: nothing is adopted lazily)
        self.adopter: Any = None
        #: what the plan cache did for the last plan built (opregistry.plancache): ``"hit"``,
        #: ``"resolved"`` (cached declarations resolved again), ``"miss"``, ``"uncacheable"``,
        #: ``"off"``; ``None`` before any
        self.plan_cache: str | None = None
        #: the id of the cached plan the last plan built came from, as it is (a ``"hit"``)
        self.plan_entry: str | None = None
        #: the ``OPREGISTRY_*`` variables of the load ``import torch`` deferred because its
        #: cached plan registers nothing (opregistry.idle); loaded when first asked for
        self.deferred: dict[str, str] | None = None
        #: that deferred load is under way (on the thread holding :attr:`lock`)
        self.deferred_loading = False


_state = ProcessState()


def process() -> ProcessState:
    """The process's :class:`ProcessState`."""
    return _state


def reset() -> ProcessState:
    """Replace the process state by an empty one, for tests; the registry must be unloaded."""
    global _state
    if _state.registry is not None:
        raise RuntimeError("opregistry.state.reset(): unload the registry first "
                           "(opregistry.get_registry().unload())")
    if _state.recorder is not None:
        _state.recorder.uninstall()
    _state = ProcessState()
    return _state


@contextlib.contextmanager
def gc_paused(promote: bool = True) -> Iterator[None]:
    """Pause the cyclic garbage collector while the pipeline builds its records.

    Discovery, collection, resolution and materialization allocate tens of
    thousands of small, long-lived objects (records, closures, torch
    registrations); with torch's million objects already on the heap, the
    collector's full passes made the pipeline grow faster than linearly
    (docs/performance.md).  Nothing here depends on cycles being freed during
    the load; the collector is restored (and runs as usual) afterwards, also
    on error.  ``promote=False`` for work whose objects do not outlive it (the
    scan of installed packages): what it leaves is garbage, not survivors to
    promote.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if promote:
                _promote_survivors()
            gc.enable()


def _promote_survivors() -> None:
    """Move every object the collector tracks to its oldest generation, without a pass.

    What a load allocates stays alive (records, closures, registrations);
    left in the young generation, the first collection after the pause
    would traverse all of it (tens of milliseconds at 10,000 ops) only to
    promote it.  ``gc.freeze()`` then ``gc.unfreeze()`` is that promotion, documented:
    every tracked object to the permanent generation and back to the oldest
    one.  Garbage cycles of the application's that were young wait for the
    next full collection.  Where the application froze objects itself
    (``gc.get_freeze_count()``: a fork server's pre-fork heap), nothing is
    moved: unfreezing would undo its freeze.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
