"""opregistry's own state, sealed while plugins run: a change is found, undone and attributed.

Plugins run inside opregistry's process, so their code could rebind what
opregistry itself uses -- ``opregistry.OpLibrary = None`` in a declarations
module makes every distribution discovered after it fail, blamed on them;
``opregistry.resolver.impls.check_kernels = ...`` would switch a rule off.
A :class:`Seal` remembers the bindings of every ``opregistry`` module and of
every class defined in one; :meth:`Seal.check`, called after each plugin's
import and hooks, lists what changed since, puts it back (so the plugins that
come next meet opregistry as it was) and says who did it:

* a module attribute set or deleted from outside (``opregistry.X = ...``,
  ``setattr``, ``delattr``) while a plugin runs is not made at all, and is
  recorded with the ``file:line`` of the code that tried (the modules' class
  is given a ``__setattr__`` that notes the writer);
* a binding changed some other way (``vars(opregistry)["X"] = ...``) is put
  back by :meth:`Seal.check`, and attributed to the plugin that was running;
* a class attribute replaced by a function is attributed to the function's
  file; anything else to the plugin whose code was running.

What is compared is the bindings (a name rebound, added or removed) of the
modules, and of their classes; the content of opregistry's mutable tables
(``keys.DEVICE_KEYS``...) is compared one level deep.  In-process code can
always do more (``gc``, ``ctypes``): this is the contract for plugins that
mean no harm and the evidence against those that do, not a sandbox.
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
import threading
import types
from typing import Any

from .model import source_of

__all__ = ["Seal", "Change", "running", "running_origin"]

#: the tables whose content, not only their binding, is part of the seal
_TABLE_MODULES = ("opregistry.keys",)


class Change:
    """One binding of opregistry's state that third-party code changed (undone since).

    A plain class, not an attrs record: this module is imported with
    ``opregistry`` itself, and a record class costs its import time.
    """

    __slots__ = ("where", "source")

    def __init__(self, where: str, source: str | None) -> None:
        #: ``opregistry.module.name`` or ``opregistry.module.Class.name``
        self.where = where
        #: ``file:line`` of the code that made it, when known
        self.source = source

    def __repr__(self) -> str:
        return f"Change({self.where!r}, {self.source!r})"


class _Running(threading.local):
    """Per thread: the distributions whose code opregistry is running, innermost last."""

    def __init__(self) -> None:
        self.origins: list[Any] = []


_running = _Running()


class running:  # noqa: N801 - a context manager: ``with running(origin):``
    """Mark ``origin``'s code as running (a plugin's import, its hooks) inside the block.

    Inside, an assignment to an opregistry module from outside opregistry is
    refused (noted, not made: :meth:`Seal.check` reports it), and what is
    declared through an ``OpLibrary`` made before the block, from a file no
    distribution is known to own, is attributed to ``origin``
    (:mod:`opregistry.ownership`).  A class, not a generator: entered once per
    plugin, twice.
    """

    __slots__ = ("origin",)

    def __init__(self, origin: Any) -> None:
        self.origin = origin

    def __enter__(self) -> None:
        _running.origins.append(self.origin)

    def __exit__(self, *exc: object) -> None:
        _running.origins.pop()


def running_origin() -> Any:
    """The :class:`~opregistry.model.Origin` whose code opregistry is running here, if any."""
    return _running.origins[-1] if _running.origins else None


_OURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


def _write(module: types.ModuleType, name: str, frame: Any) -> bool:
    """Note a write to ``module.name`` from outside; whether to make it.

    While a plugin's code runs, a write from outside opregistry (and the import
    system, which binds a package's submodules) is refused: the plugins after
    it must meet opregistry as it was, and the writer is named.
    """
    source = source_of(frame)
    file = frame.f_code.co_filename
    refused = bool(_running.origins) and not file.startswith(_OURS) and "importlib" not in file
    if len(_WRITES) > 1000:  # nobody checks (no plugin is running): keep it bounded
        del _WRITES[:500]
    _WRITES.append((f"{module.__name__}.{name}", source, refused))
    return not refused


class _WatchedModule(types.ModuleType):
    """An opregistry module that notes who sets or deletes its attributes from outside."""

    def __setattr__(self, name: str, value: Any) -> None:
        if _write(self, name, sys._getframe(1)):
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if _write(self, name, sys._getframe(1)):
            super().__delattr__(name)


#: (binding, file:line, refused) of every write to an opregistry module from outside since
#: the last :meth:`Seal.check` (tests' monkeypatching between checks lands here too: cleared)
_WRITES: list[tuple[str, str | None, bool]] = []


#: the namespaces a seal covers: (name, the live mapping), and the sys.modules size they were
#: found at -- opregistry's classes never change, so they are found once per new module
_SPACES: list[tuple[str, Any]] = []
_SEEN: dict[str, Any] = {}
_SCANNED_AT = [-1]


def _spaces() -> list[tuple[str, Any]]:
    """Every opregistry module's namespace and those of its classes (re-scanned on new modules).

    ``sys.modules`` keeps its order: only the modules added since the last
    scan are looked at, unless some were removed meanwhile.
    """
    size = len(sys.modules)
    if size == _SCANNED_AT[0]:
        return _SPACES
    start = _SCANNED_AT[0] if 0 <= _SCANNED_AT[0] < size else 0
    _SCANNED_AT[0] = size
    for name, module in list(itertools.islice(sys.modules.items(), start, None)):
        if not (name == "opregistry" or name.startswith("opregistry.")) or \
                not isinstance(module, types.ModuleType) or _SEEN.get(name) is module:
            continue
        _SEEN[name] = module
        _watch(module)
        namespace = module.__dict__
        _SPACES.append((name, namespace))
        for attr, value in list(namespace.items()):
            if isinstance(value, type) and value.__module__ == name:
                _SPACES.append((f"{name}.{attr}", value.__dict__))
    return _SPACES


def _watch(module: types.ModuleType) -> None:
    if type(module) is types.ModuleType:
        module.__class__ = _WatchedModule


class Seal:
    """The bindings of opregistry's modules and classes, as they were when taken.

    Compared by identity (``operator.is_`` over each namespace's values, in
    C): an object's own ``__eq__`` never runs, so a replacement cannot claim
    to equal what it replaced.  Taking one and checking it cost ~0.1 ms each
    for opregistry's ~100 namespaces.
    """

    def __init__(self) -> None:
        #: name -> (the live namespace, its keys, its values, in order)
        self._spaces: dict[str, tuple[Any, tuple[str, ...], tuple[Any, ...]]] = {}
        self._tables: dict[str, tuple[Any, Any]] = {}
        self._take()

    def _take(self) -> None:
        spaces = _spaces()
        if len(spaces) == len(self._spaces):
            return  # no module joined since
        for name, namespace in spaces:
            if name in self._spaces:
                continue
            self._spaces[name] = (namespace, tuple(namespace), tuple(namespace.values()))
            if name in _TABLE_MODULES:
                for attr, value in list(namespace.items()):
                    # its tables, not __builtins__ (a dict, Python's, that others may change)
                    if isinstance(value, (dict, set, list)) and not attr.startswith("_"):
                        self._tables[f"{name}.{attr}"] = (value, value.copy())

    def check(self) -> list[Change]:
        """What changed since the seal was taken (or last checked); each change is undone."""
        changes = [Change(where, source) for where, source, refused in _WRITES if refused]
        writes = {where: source for where, source, _ in _WRITES}
        _WRITES.clear()
        for name, (namespace, keys, values) in list(self._spaces.items()):
            if len(namespace) == len(values) and all(map(operator.is_, namespace.values(), values)):
                continue
            saved = dict(zip(keys, values))
            for key in _differing(namespace, saved):
                value = namespace.get(key)
                if key not in saved and isinstance(value, types.ModuleType) and \
                        value.__name__ == f"{name}.{key}":
                    saved[key] = value  # a submodule imported for the first time: the import
                    continue            # system binds it on its package
                source = writes.get(f"{name}.{key}") or (
                    source_of(value) if isinstance(value, types.FunctionType) else None)
                changes.append(Change(f"{name}.{key}", source))
            if isinstance(namespace, dict):
                _restore(namespace.__setitem__, namespace.__delitem__, namespace, saved)
            else:  # a class's mappingproxy: through type's own setattr
                cls = self._class(name)
                _restore(lambda k, v: type.__setattr__(cls, k, v),
                         lambda k: type.__delattr__(cls, k), namespace, saved)
            self._spaces[name] = (namespace, tuple(namespace), tuple(namespace.values()))
        for name, (table, saved) in self._tables.items():
            if table != saved:  # opregistry's own tables of str: no plugin __eq__ involved
                changes.append(Change(f"{name} (its content)", None))
                table.clear()
                table.extend(saved) if isinstance(table, list) else table.update(saved)
        self._take()  # modules imported meanwhile join the seal
        return changes

    def _class(self, name: str) -> type:
        module, _, attr = name.rpartition(".")
        namespace, keys, values = self._spaces[module]
        return dict(zip(keys, values))[attr]  # type: ignore[no-any-return]


def _differing(current: Any, saved: dict[str, Any]) -> list[str]:
    keys = set(current) | set(saved)
    return sorted(k for k in keys if k not in current or k not in saved
                  or current[k] is not saved[k])


def _restore(set_item: Any, del_item: Any, current: Any, saved: dict[str, Any]) -> None:
    for key in _differing(current, saved):
        if key in saved:
            set_item(key, saved[key])
        else:
            del_item(key)
