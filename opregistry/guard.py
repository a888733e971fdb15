"""Running code opregistry did not write: every exception contained, every unplanned change to torch caught.

:func:`run` is the one way the pipeline runs third-party code (a plugin's
import, a hook, a kernel module's import, a backend hook).  It returns the
result or the exception -- any ``BaseException`` but a real Ctrl-C (see
:mod:`opregistry.containment`) -- and, when torch is imported, what the code
registered with torch by itself.  A registration the plan does not contain
is **undone** (its ``Library`` destroyed: torch restores the kernel it
replaced) and reported as an error of the distribution, unless the override
policy names the op or namespace.  Which registrations are unplanned:

* any kernel or definition for an op of a *protected* namespace -- torch's
  own (``aten``...), or one opregistry registers (the plan's);
* any new op definition made from the distribution's own files (a ``DEF``
  outside the plan).

Registrations torch makes while importing its own modules (a plugin that
imports ``torch._inductor``) are torch's business and left alone.  A native
library the code loads by itself (``torch.ops.load_library``, an extension
module's import) is judged by the same rules from what the dispatcher gained
and the kernels it replaced, but cannot be undone: its distribution is left
out.  For a native library an op package declares, the materializer
compares the dispatcher before and after loading it (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterable

from attrs import frozen

from .config import Policy
from .containment import contain
from .errors import DOCS_URL
from .keys import RESERVED_NAMESPACES
from .model import Origin, Problem, source_of
from .seal import running, running_origin
from .state import process

__all__ = ["Guarded", "run", "owned_by", "raised_at", "resolve_ref", "initializing",
           "torch_arrived", "running", "running_origin"]

#: frames in these places are machinery, not the line a plugin author must fix
_MACHINERY = (os.path.dirname(os.path.abspath(__file__)) + os.sep, "<attrs generated",
              contextlib.__file__)


def initializing(module: Any) -> bool:
    """Whether ``module`` is still being imported (its code has not finished running).

    The one reading of importlib's ``__spec__._initializing`` flag: a module
    half-imported has not defined everything yet, and reading from it is
    not the same as importing it.
    """
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def resolve_ref(ref: Any, want_callable: bool = True) -> Any:
    """Import a ``"module:function"`` reference, or return a callable as is.

    Importing runs the module's code: call it through :func:`run`.
    ``want_callable=False`` accepts any object (an autocast rule's ``torch:bfloat16``).
    """
    if not isinstance(ref, str):
        return ref
    module_name, _, attr_path = ref.partition(":")
    obj: Any = sys.modules.get(module_name)
    # materializing resolves thousands of references into a few modules, all
    # imported already: sys.modules answers ~10x faster than import_module,
    # which is still asked for anything not there or still being imported
    if obj is None or initializing(obj):
        import importlib

        obj = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if want_callable and not callable(obj):
        raise TypeError(f"{ref} is a {type(obj).__name__}, not a callable")
    return obj


def raised_at(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``exc`` in the plugin's own code.

    importlib's frames and opregistry's own (a :class:`DeclarationError`
    raised by a record's validator) are skipped: the author needs the line
    of *their* ``lib.define(...)`` or ``sys.exit()``, not of our check.
    """
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "importlib" not in f.filename and not f.filename.startswith(_MACHINERY)]
    # none of the plugin's own (a module that does not exist): no line to point at,
    # rather than one of opregistry's, which the user cannot fix
    return source_of(frames[-1]) if frames else None


@frozen
class Guarded:
    """The outcome of third-party code: its result, or the exception it raised, and what it did to torch."""

    result: Any
    error: BaseException | None
    #: errors (and warnings for registrations the policy allows) for unplanned registrations
    problems: tuple[Problem, ...] = ()


def owned_by(module: str) -> Callable[[str], bool]:
    """Whether a ``file:line`` lies in the top-level package of ``module`` (known after its import)."""
    def owns(where: str) -> bool:
        top = sys.modules.get(module.partition(".")[0])
        paths = list(getattr(top, "__path__", None) or [])
        file = getattr(top, "__file__", None)
        if not paths and file:
            return where.startswith(file + ":")
        return any(where.startswith(os.path.join(os.path.abspath(p), "")) for p in paths)

    return owns


def torch_arrived() -> None:
    """torch has just been imported, from inside third-party code :func:`run` is running.

    Called by the autoload entry point (:mod:`opregistry.autoload`), which torch
    runs at the end of ``import torch``, while opregistry is importing plugins.
    From here on, what that code registers with torch is watched exactly as it
    is when torch was imported first: a plugin that imports torch and makes a
    ``Library`` of its own at import is judged the same under ``opregistry
    doctor`` (no torch) as under ``import torch``.
    """
    frames = process().thread.torch_watches
    if not frames or frames[-1]:
        return
    from .torch_state import watch_registrations

    manager = watch_registrations()
    frames[-1].extend((manager, manager.__enter__()))


def _contained(fn: Callable[..., Any], args: tuple[Any, ...]) -> Guarded:
    return Guarded(*contain(fn, *args))


def _until_torch(fn: Callable[..., Any], args: tuple[Any, ...], origin: Origin, what: str,
                 policy: Policy | None, owns: Callable[[str], bool] | None) -> Guarded:
    """Contain ``fn`` (torch not imported); watch it from the moment it imports torch."""
    frame: list[Any] = []
    frames = process().thread.torch_watches
    frames.append(frame)
    try:
        outcome = _contained(fn, args)
    finally:
        frames.pop()
        if frame:
            frame[0].__exit__(None, None, None)
    if not frame:
        return outcome
    problems = _unplanned(frame[1], origin, what, RESERVED_NAMESPACES, policy or Policy(),
                          owns or (lambda where: False))
    return Guarded(outcome.result, outcome.error, problems)


def run(fn: Callable[..., Any], *args: Any, origin: Origin, what: str,
        protected: Iterable[str] | None = None, policy: Policy | None = None,
        owns: Callable[[str], bool] | None = None, until_torch: bool = False) -> Guarded:
    """Call ``fn(*args)``, third-party code, contained.

    :param origin: the distribution whose code this is (named in problems).
    :param what: what the code was doing, for messages ("importing x.kernels").
    :param protected: namespaces whose ops third-party code must not touch
        (besides torch's reserved ones); ``None`` switches the watch on torch off.
    :param policy: the override policy; a registration it allows is kept, with a warning.
    :param owns: whether a ``file:line`` belongs to the distribution (for new ``DEF``s).
    :param until_torch: torch is not imported yet: watch the code from the moment it
        imports torch (:func:`torch_arrived`), as if torch had been imported first.
    """
    if protected is None or "torch" not in sys.modules:
        if until_torch and "torch" not in sys.modules:
            return _until_torch(fn, args, origin, what, policy, owns)
        # nothing to watch: containment only.  The materializer resolves thousands
        # of kernel references in modules imported already through here, so this
        # path costs one call and one record, no context manager
        return _contained(fn, args)
    from .torch_state import watch_registrations

    with watch_registrations() as watch:
        result, error = contain(fn, *args)
    problems = _unplanned(watch, origin, what, frozenset(protected) | RESERVED_NAMESPACES,
                          policy or Policy(), owns or (lambda where: False))
    return Guarded(result, error, problems)


def _unplanned(watch: Any, origin: Origin, what: str, protected: frozenset[str],
               policy: Policy, owns: Callable[[str], bool]) -> tuple[Problem, ...]:
    problems = []
    for handle, namespace, kind, creator in watch.created:
        if creator is None:
            continue  # torch importing one of its own modules
        problem = _judge_library(watch, handle, namespace, kind, creator, origin, what,
                                 protected, policy, owns)
        if problem is not None:
            problems.append(problem)
    for loaded, defined, replaced, where in watch.natives:
        problems.extend(_native(origin, what, loaded, defined, replaced, where, protected,
                                policy, owns))
    earlier = [e for e in watch.events if e.site is not None and not watch.made(e)]
    foreign = sorted({e.op for e in earlier if e.op.partition("::")[0] in protected})
    if foreign:
        where = next((e.site for e in earlier if e.op in foreign), None)
        problems.append(Problem(
            code="plugin-replaced-torch-kernel",
            message=f"{origin} registered kernels for {', '.join(foreign)} while {what}, "
                    f"outside opregistry, through a torch.library.Library it created earlier; "
                    f"it bypasses the override policy, and opregistry cannot undo it: it stays "
                    f"in effect",
            hint=f"block it (OPREGISTRY_BLOCK={origin.distribution}) or uninstall it; a package "
                 f"that means to replace a kernel declares it (OpLibrary(ns, 'IMPL'), "
                 f"override=True) and the user allows it with OPREGISTRY_ALLOW_OVERRIDE",
            culprits=(origin,), op=foreign[0], source=where))
    return tuple(problems)


def _judge_library(watch: Any, handle: Any, namespace: str, kind: str, creator: str,
                   origin: Origin, what: str, protected: frozenset[str], policy: Policy,
                   owns: Callable[[str], bool]) -> Problem | None:
    """A ``Library`` the code created: undone (and a problem) if it registered outside the plan."""
    from .torch_state import undo_library

    events = [e for e in watch.events if e.handle is handle]
    touched = sorted({e.op for e in events})
    if not touched and kind == "DEF":
        touched = [f"{namespace}::*"]  # a namespace claimed, nothing in it yet
    hits = [op for op in touched if op.partition("::")[0] in protected]
    new_defs = sorted({e.op for e in events if e.slot == "schema"}) if owns(creator) else []
    if not hits and not new_defs:
        return None
    found = hits or new_defs
    if all(policy.allows(op) for op in found):
        return _problem(origin, what, found, creator, allowed=True)
    undo_library(handle, [e.library for e in events])
    return _problem(origin, what, found, creator, allowed=False)


def _native(origin: Origin, what: str, loaded: str, defined: frozenset[str],
            replaced: tuple[tuple[str, str, str], ...], where: str | None,
            protected: frozenset[str], policy: Policy,
            owns: Callable[[str], bool]) -> list[Problem]:
    """What a native library the plugin loaded by itself did: the same rules as for Python.

    Unlike a ``Library``, a shared library cannot be undone: its registrations
    stay, and the distribution is left out.
    """
    problems = []
    hits = sorted(op for op in defined if op.partition("::")[0] in protected)
    found = hits or (sorted(defined) if where and owns(where) else [])
    declare = (f"declare the library (OpLibrary(ns, native=NativeLibrary(...)), "
               f"{DOCS_URL}op-authors/#native-c-op-packages) so that it is resolved before it "
               f"loads")
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        if all(policy.allows(op) for op in found):
            problems.append(Problem(
                code="plugin-registration-allowed",
                message=f"{origin} loaded {loaded} while {what}, which registered {shown} "
                        f"outside opregistry; the override policy allows it, so it stays in "
                        f"effect", hint=declare, others=(origin,), op=found[0], source=where))
        else:
            problems.append(Problem(
                code="plugin-registered-outside-plan",
                message=f"{origin} loaded {loaded} while {what}, which registered {shown} "
                        f"outside opregistry's plan; a native library cannot be unloaded, so "
                        f"its registrations stay in the process, and {origin.distribution} is "
                        f"left out",
                hint=f"{declare}, or block {origin.distribution} (OPREGISTRY_BLOCK)",
                culprits=(origin,), op=found[0], source=where))
    swapped = sorted({(op, key, site) for op, key, site in replaced
                      if op.partition("::")[0] in protected})
    if swapped:
        shown = ", ".join(f"{op} ({key})" for op, key, _ in swapped[:5])
        problems.append(Problem(
            code="plugin-replaced-torch-kernel",
            message=f"{origin} loaded {loaded} while {what}, which replaced the kernel of "
                    f"{shown} (new kernel registered at {swapped[0][2]}); torch cannot take it "
                    f"back: it stays replaced until the process ends, and "
                    f"{origin.distribution} is left out",
            hint=f"block {origin.distribution} (OPREGISTRY_BLOCK) or uninstall it; a package "
                 f"that means to replace a kernel declares it (OpLibrary(ns, 'IMPL'), "
                 f"override=True) and the user allows it with OPREGISTRY_ALLOW_OVERRIDE",
            culprits=(origin,), op=swapped[0][0], key=swapped[0][1], source=where))
    return problems


def _op(entry: str) -> str:
    """``"aten/add.Tensor/CPU"`` -> ``"aten::add.Tensor"``."""
    namespace, _, rest = entry.partition("/")
    return f"{namespace}::{rest.rpartition('/')[0]}"


def _problem(origin: Origin, what: str, ops: list[str], where: str, *, allowed: bool) -> Problem:
    shown = ", ".join(ops[:5]) + (f" and {len(ops) - 5} more" if len(ops) > 5 else "")
    if allowed:
        return Problem(
            code="plugin-registration-allowed",
            message=f"{origin} registered {shown} with torch itself while {what}, outside "
                    f"opregistry; the override policy allows it, so it stays in effect",
            hint="declare the registration instead (OpLibrary), or remove it from "
                 "OPREGISTRY_ALLOW_OVERRIDE", others=(origin,), op=ops[0], source=where)
    return Problem(
        code="plugin-registered-outside-plan",
        message=f"{origin} registered {shown} with torch itself while {what}, outside "
                f"opregistry's plan; opregistry undid it and left {origin.distribution} out",
        hint=f"declare ops and kernels through opregistry (OpLibrary) instead of "
             f"torch.library at import; if replacing them is intended, allow it with "
             f"OPREGISTRY_ALLOW_OVERRIDE={ops[0].partition('::')[0]}, or block "
             f"{origin.distribution} (OPREGISTRY_BLOCK)",
        culprits=(origin,), op=ops[0], source=where)
