"""Run something right after a module's import finishes: a post-import hook.

A kernel opregistry registers for an op that a package defines with
``torch.library`` at its own import (an override the policy allows) must be
registered *after* that package registered its own: torch keeps the last
registration, and the package is usually imported after ``import torch``.
:func:`after_import` runs a callback once the named module has been
executed -- at once if it already has been -- through a finder on
``sys.meta_path`` that wraps the loader of the modules waited for, and of no
other.  What a callback raises is contained (:mod:`opregistry.containment`):
a module's import never fails because of it.
"""

from __future__ import annotations

import sys
import threading
from importlib.abc import Loader, MetaPathFinder
from typing import Any, Callable

from .containment import contain
from .logs import get_logger
from .state import process

__all__ = ["after_import", "flush", "pending"]

log = get_logger()

_lock = threading.Lock()


def _waiting() -> dict[str, list[Callable[[Any], None]]]:
    """Module name -> callbacks waiting for its import to finish (in the process state)."""
    return process().after_import


def pending() -> dict[str, int]:
    """Module name -> how many callbacks wait for it."""
    with _lock:
        return {name: len(callbacks) for name, callbacks in _waiting().items()}


def after_import(module: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module object)`` once ``module`` is imported (now, if it is already).

    A module being imported right now (it imported torch, whose autoload
    loads the registry) cannot be waited for by its loader, which runs
    already: :func:`flush` runs its callbacks once it has finished, and
    opregistry calls it when it next sees an import or a registration.
    """
    if _finished(module):
        _run(module, [callback], sys.modules[module])
        return
    with _lock:
        _waiting().setdefault(module, []).append(callback)
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())


def flush() -> None:
    """Run the callbacks of every module waited for whose import has finished meanwhile."""
    with _lock:
        waiting = _waiting()
        done = [name for name in waiting if _finished(name)]
        ready = [(name, waiting.pop(name)) for name in done]
    for name, callbacks in ready:
        _run(name, callbacks, sys.modules[name])


def _finished(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None),
                                              "_initializing", False)


def _run(name: str, callbacks: list[Callable[[Any], None]], module: Any) -> None:
    for callback in callbacks:
        _, exc = contain(callback, module)
        if exc is not None:
            log.warning("a registration waiting for a module's import failed", module=name,
                        error=repr(exc))


class _Loader(Loader):
    """The module's own loader, and the callbacks waiting for it once it has run."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        with _lock:
            callbacks = _waiting().pop(self.name, [])
        _run(self.name, callbacks, module)

    def __getattr__(self, name: str) -> Any:  # get_data, get_filename, is_package, ...
        return getattr(self.loader, name)


class _Finder(MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give a module waited for."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if process().after_import:
            flush()  # a module that was being imported when waited for may be done by now
        with _lock:
            if fullname not in _waiting():
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, fullname)
        return spec
