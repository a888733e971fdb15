"""Adoption carried out: imports on first touch, eager imports, kernel switches, the lock.

:class:`Adopter` holds what the loaded registry adopted (the plan's
:class:`~opregistry.adoption.Adopted` records) and is the process's
``process().adopter`` while the registry is loaded:

* **lazy** -- :func:`opregistry.torch_state.install_ops_hooks` routes the
  first touch of ``torch.ops.<ns>`` here, *before* torch creates the
  namespace object, and an op lookup that fails: the modules that register
  the namespace (or define the op) are imported then, contained, and the
  lookup goes on.  ``torch.export.load`` reaches ops the same way
  (``getattr(torch.ops, ns)``), so a program exported with a package's ops
  loads in a fresh process that never imported the package;
* **eager** -- imported when the registry loads;
* **locked** -- in locked mode (``OPREGISTRY_LOCK``) a distribution is
  imported only if its files match the lock; otherwise it is refused,
  named, and left alone (its user can still import it);
* **kernel switches** -- a switch (``OPREGISTRY_KERNELS=-bitsandbytes::op:CPU``)
  on an adopted kernel is applied as the package registers it: the
  :class:`~opregistry.torch_state.Recorder` does not make that
  ``Library.impl`` call (whoever imports the package), so the key's next
  kernel serves.  A kernel torch registers without ``Library.impl`` (the
  kernels of a ``custom_op``) cannot be switched off this way: reported.

Nothing here raises: a failing import is a problem on the registry
(``adoption-import-failed``) and a warning naming the distribution and the
module, never an exception at the user's ``torch.ops.<ns>``.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from typing import Any, Callable, Iterable

from .adoption import Adopted
from .containment import contain, describe, interrupts_watched
from .guard import initializing as _initializing
from .logs import get_logger
from .model import Origin, Problem
from .plans import Plan
from .state import process

__all__ = ["Adopter", "NamespaceHolds", "activate", "deactivate"]

log = get_logger()

#: the Recorder's slot of a kernel key the scan reads (register_fake is a "Fake" handle)
_SLOTS = {"Meta": "Fake"}


def _origin(adopted: Adopted) -> Origin:
    return Origin(distribution=adopted.name, version=adopted.distribution.version)


class NamespaceHolds:
    """The ``torch.ops.<namespace>`` objects made while this thread imports the package that
    registers the namespace, held out of ``torch.ops`` until that import finished.

    torch caches the object in ``torch.ops`` on its first lookup.  A package touches its own
    namespace as it registers (bitsandbytes); cached then, another thread would reach the
    package's ops without passing the touch hook, and call them before their kernels are
    registered (its ops defined, its CPU kernels not yet: ``NotImplementedError``) -- whether
    the import is opregistry's (the first touch) or the user's own (``import bitsandbytes``
    in a worker thread).  Uncached, that thread's touch imports the package too, and Python's
    module lock makes it wait for the import (:func:`opregistry.torch_state.install_ops_hooks`).
    """

    def __init__(self) -> None:
        self._held: dict[str, Any] = {}
        self._mutex = threading.Lock()

    def hold(self, namespace: str, make: Callable[[], Any]) -> Any:
        """The object for ``namespace``: made once (``make``, which leaves it uncached)."""
        with self._mutex:
            found = self._held.get(namespace)
            if found is None:
                found = self._held[namespace] = make()
            return found

    def release(self, namespace: str) -> Any:
        """The object :meth:`hold` kept for ``namespace``, once (``None``: none kept)."""
        with self._mutex:
            return self._held.pop(namespace, None)


class Adopter:
    """The loaded registry's adoptions: what the first touch of each namespace imports."""

    def __init__(self, plan: Plan, lock: str | None, report: Callable[[Problem], None]) -> None:
        self.report = report
        self.lock = lock
        #: namespace -> (adopted, modules) still to import on its first touch
        self.namespaces: dict[str, list[tuple[Adopted, tuple[str, ...]]]] = {}
        #: ``ns::name`` -> (adopted, module) to import when the op is looked up and missing
        self.ops: dict[str, tuple[Adopted, str]] = {}
        #: distribution -> what happened: ``imported``, ``failed: ...``, ``refused: ...``
        self.outcomes: dict[str, str] = {}
        #: namespace -> (adoption, module) of each module that registers in it or defines an
        #: op of it; (distribution, module) -> the exception its import raised: why an op is
        #: missing (:meth:`why_missing`)
        self.owners: dict[str, list[tuple[Adopted, str]]] = {}
        self.import_errors: dict[tuple[str, str], str] = {}
        #: (distribution, module) -> the package whose failed import left the module behind
        #: in ``sys.modules``: the package's import error is the module's
        self.left_behind: dict[tuple[str, str], str] = {}
        #: (op, key) -> where a switched-off registration was refused
        self.switched: dict[tuple[str, str], str] = {}
        self._mutex = threading.RLock()
        #: the ``torch.ops.<namespace>`` objects made while their first touch imports
        self.holds = NamespaceHolds()
        self._verdicts: dict[str, str | None] = {}
        self._held_checked: set[str] = set()
        self._vetoes: dict[tuple[str, str], list[tuple[Adopted, frozenset[str], str]]] = {}
        for adopted in plan.adoptions:
            self._table(adopted)

    def _table(self, adopted: Adopted) -> None:
        if adopted.active:
            for ns, modules in adopted.modules:
                self.namespaces.setdefault(ns, []).append((adopted, modules))
                self.owners.setdefault(ns, []).extend((adopted, m) for m in modules)
            for op, module in adopted.op_modules:
                self.ops.setdefault(op.split(".", 1)[0], (adopted, module))
                self.owners.setdefault(op.partition("::")[0], []).append((adopted, module))
        files = frozenset(_real(r.file) for r in (*adopted.registrations,
                                                  *(k.registration for k in adopted.kernels))
                          if r.file)
        for k in adopted.kernels:
            if k.disabled_by:
                self._vetoes.setdefault((k.op, _SLOTS.get(k.key, k.key)), []).append(
                    (adopted, files, k.disabled_by))

    # -- the hooks (torch_state.install_ops_hooks) ----------------------------------

    # No lock is held while a package is imported: Python's own module locks order
    # concurrent imports (a second thread touching the namespace waits for the first's
    # import to finish), and a lock of opregistry's held across an import would deadlock
    # with a thread that holds a module lock and touches an adopted namespace.

    def namespace_touched(self, namespace: str) -> None:
        """The first touch of ``torch.ops.<namespace>``: import what registers it."""
        with self._mutex:
            entries = list(self.namespaces.get(namespace, ()))
        for adopted, modules in entries:
            self.adopt(adopted, modules, f"torch.ops.{namespace} was first touched")
        if self.importing(namespace):
            return  # this thread is inside the package's import: the first touch comes after
        with self._mutex:
            self.namespaces.pop(namespace, None)

    def importing(self, namespace: str) -> bool:
        """Whether a module the first touch of ``namespace`` imports is still being imported,
        after :meth:`namespace_touched` -- by this thread, then: another thread's import, it
        waits for (the package touches its own namespace as it registers)."""
        with self._mutex:
            entries = list(self.namespaces.get(namespace, ()))
        return any(_initializing(found) for _, modules in entries for m in modules
                   if (found := sys.modules.get(m)) is not None)

    def op_missing(self, namespace: str, name: str) -> bool:
        """``torch.ops.<namespace>.<name>`` is not in torch: import what defines it, if known."""
        with self._mutex:
            entry = self.ops.get(f"{namespace}::{name}")
            untouched = namespace in self.namespaces
        if entry is None:
            if not untouched:
                return False
            # torch.ops.<namespace> was made before its first touch came through the hook (an
            # op package's FRAGMENT of it, registered at `import torch`, made it): the first
            # missing op imports what that touch would have -- an op the scan cannot name
            self.namespace_touched(namespace)
            return True
        adopted, module = entry
        ok = self.adopt(adopted, (module,), f"torch.ops.{namespace}.{name} was looked up")
        with self._mutex:
            self.ops.pop(f"{namespace}::{name}", None)
        return ok

    def why_missing(self, namespace: str) -> str | None:
        """Why ops of ``namespace`` may be missing from torch (:func:`_missing_because`)."""
        with self._mutex:
            owners = list(self.owners.get(namespace, ()))
        return _missing_because(namespace, owners, self.import_errors, self._verdicts,
                                self.left_behind)

    # -- importing --------------------------------------------------------------------

    def adopt(self, adopted: Adopted, modules: Iterable[str], why: str) -> bool:
        """Import ``modules`` of ``adopted`` (contained); whether every import succeeded."""
        refused = self._refused(adopted)
        if refused is not None:
            return False
        ok = True
        for module in modules:
            found = sys.modules.get(module)
            if found is not None and not _initializing(found):
                package = _left_behind(module)
                if package is None:
                    continue  # imported
                if not _package_imports(self, adopted, module, package, why):
                    ok = False
                continue
            # being imported by this thread (it registers itself as it goes): import_module
            # returns it at once; by another thread: waits for that import to finish
            start = time.perf_counter()
            with interrupts_watched():
                _, exc = contain(importlib.import_module, module)
            if exc is not None:
                ok = False
                self._failed(adopted, module, why, exc)
                continue
            self.outcomes.setdefault(adopted.name, "imported")
            log.info("adopted", distribution=adopted.distribution.text, module=module,
                     why=why, ms=round((time.perf_counter() - start) * 1000, 1))
        _report_switches_held(self, adopted)
        return ok

    def _failed(self, adopted: Adopted, module: str, why: str, exc: BaseException) -> None:
        text = describe(exc)
        self.outcomes[adopted.name] = f"failed: importing {module}: {text}"
        self.import_errors[(adopted.name, module)] = text
        log.warning("adopted package failed to import", distribution=adopted.distribution.text,
                    module=module, error=text)
        self.report(Problem(
            code="adoption-import-failed",
            message=f"{adopted.distribution.text} is adopted, and importing {module} (because "
                    f"{why}) raised {text}; its ops in torch.ops are missing",
            hint=f"import {module} yourself to see the full error; to stop opregistry importing "
                 f"it, set OPREGISTRY_ADOPT_BLOCK={adopted.name}",
            others=(_origin(adopted),)))

    def eager(self, plan: Plan) -> None:
        """Import every adoption declared ``load="eager"``, now."""
        for adopted in plan.adoptions:
            if adopted.active and adopted.load == "eager":
                with self._mutex:
                    for ns, _ in adopted.modules:
                        self.namespaces.pop(ns, None)
                    self.adopt(adopted, adopted.all_modules(), "it is adopted eagerly")

    # -- locked mode ------------------------------------------------------------------

    def _refused(self, adopted: Adopted) -> str | None:
        """Why the lock refuses ``adopted`` (checked once), or ``None``."""
        if self.lock is None:
            return None
        if adopted.name not in self._verdicts:
            verdict = lock_verdict(adopted, self.lock)
            self._verdicts[adopted.name] = verdict
            if verdict is not None:
                self.outcomes[adopted.name] = f"refused: {verdict}"
                log.warning("adopted package refused by the lock",
                            distribution=adopted.distribution.text, reason=verdict)
                self.report(Problem(
                    code="lock-mismatch",
                    message=f"{adopted.distribution.text} is adopted, but does not match the "
                            f"lockfile {self.lock!r} (locked mode), so opregistry did not import "
                            f"it: {verdict}",
                    hint=f"install the locked version of {adopted.name}, or, if this content "
                         f"is the new truth, review it and run 'opregistry lock -o {self.lock}'",
                    others=(_origin(adopted),)))
        return self._verdicts[adopted.name]

    # -- kernel switches ----------------------------------------------------------------

    def veto(self, registration: Any) -> bool:
        """Whether a ``Library.impl`` call is a kernel a switch turns off (the Recorder asks)."""
        found = self._vetoes.get((registration.op, registration.slot))
        if not found or registration.site is None:
            return False
        site = _real(registration.site.rpartition(":")[0])
        for adopted, files, switch in found:
            if site in files:
                self.switched[(registration.op, registration.slot)] = registration.site
                log.info("kernel switched off", distribution=adopted.distribution.text,
                         op=registration.op, key=registration.slot, switch=switch,
                         site=registration.site)
                return True
        return False


def _package_imports(adopter: Adopter, adopted: Adopted, module: str, package: str,
                     why: str) -> bool:
    """``module`` is in ``sys.modules`` but ``package``, which holds it, is not: the
    package's import failed after importing it (Python keeps the submodules of a failed
    import).  Whether the package imports now; its import error is ``module``'s.

    A failure this adopter recorded (importing the package, or a module in it) is not
    imported again: its error stands.  One it has not seen (the package's user
    imported it) is imported, contained, as ``import <module>`` would.
    """
    if (adopted.name, module) in adopter.import_errors:
        return False
    seen = [m for d, m in adopter.import_errors if d == adopted.name
            and (m == package or m.startswith(f"{package}."))]
    if seen:
        adopter.left_behind[(adopted.name, module)] = min(seen, key=len)
        return False
    adopter.left_behind[(adopted.name, module)] = package
    with interrupts_watched():
        _, exc = contain(importlib.import_module, package)
    if exc is not None:
        adopter._failed(adopted, package, why, exc)
        return False
    del adopter.left_behind[(adopted.name, module)]
    adopter.outcomes.setdefault(adopted.name, "imported")
    return True


def _report_switches_held(adopter: Adopter, adopted: Adopted) -> None:
    """Report each switched-off kernel of ``adopted`` torch holds all the same.

    The Recorder leaves a switched-off ``Library.impl`` out as the package
    makes it; one made before the registry loaded (the package imported
    with ``OPREGISTRY_AUTOLOAD=0``, before ``opregistry.load()``) is in torch.
    """
    from . import torch_state

    if adopted.name in adopter._held_checked:
        return
    adopter._held_checked.add(adopted.name)
    files = {_real(r.file) for r in (*adopted.registrations,
                                     *(k.registration for k in adopted.kernels)) if r.file}
    for k in adopted.kernels:
        if not k.disabled_by or (k.op, _SLOTS.get(k.key, k.key)) in adopter.switched:
            continue
        where = torch_state.kernel_registrations(k.op).get(k.key)
        if where is None or _real(where.rpartition(":")[0]) not in files:
            continue
        adopter.report(Problem(
            code="kernel-switch-not-applied", severity="warning",
            message=f"{k.disabled_by} switches off the {k.key} kernel of {k.op}, but "
                    f"{adopted.distribution.text} registered it (at {where}) before the "
                    f"registry loaded, when nothing could leave it out; it stays",
            hint=f"let import torch load the registry before {adopted.name} is imported "
                 f"(do not set OPREGISTRY_AUTOLOAD=0), or restart the process",
            op=k.op, key=k.key, source=where))


def _left_behind(module: str) -> str | None:
    """The outermost package of ``module`` missing from ``sys.modules`` (its import failed
    after importing ``module``), or ``None`` when every one is there."""
    parts = module.split(".")
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if package not in sys.modules:
            return package
    return None


def _real(path: str) -> str:
    return os.path.realpath(path) if path else path


def lock_verdict(adopted: Adopted, lockfile: str) -> str | None:
    """Why ``adopted``'s installed files do not match ``lockfile``, or ``None`` when they do."""
    from .digests import contents, file_differences
    from .errors import LockMismatchError
    from .lockfile import installed, read_lock

    try:
        # read_lock checks the shape: every table below is an object, every entry too
        locked = read_lock(lockfile)
    except LockMismatchError as exc:  # unusable (missing, malformed, edited): refused
        return f"the lockfile cannot be used ({exc.message})"
    except Exception as exc:  # noqa: BLE001 - an unusable lock proves nothing: refused
        return f"the lockfile cannot be used ({describe(exc)})"
    versions = locked.get("adopted", {})
    name, version = adopted.name, adopted.distribution.version
    if name not in versions:
        return f"the lockfile does not name {name} among its adopted distributions"
    if versions[name].get("version") != version:
        return f"version {version} is installed, the lockfile has {versions[name].get('version')}"
    recorded = locked.get("contents", {}).get(name)
    dist = installed([name]).get(name)
    if recorded is None or dist is None:
        return f"the lockfile records no content for {name}"
    here = contents(dist, trust_record=False)
    if here["digest"] == recorded.get("digest") and here["files"] == recorded.get("files"):
        return None
    prefix = f"distribution {name}: "
    found = [d[len(prefix):] if d.startswith(prefix) else d
             for d in file_differences(name, recorded, here, "in the lockfile", "here")]
    return "; ".join(found) or "its files differ from the lockfile"


def activate(plan: Plan, lock: str | None, report: Callable[[Problem], None]) -> Adopter | None:
    """Make ``plan``'s adoptions the process's: hooks on ``torch.ops``, switches, eager imports.

    Returns the :class:`Adopter` (``None`` when nothing is adopted and no switch applies).
    """
    from . import torch_state

    if not plan.adoptions:
        return None
    adopter = Adopter(plan, lock, report)
    if not torch_state.install_ops_hooks():
        log.warning("this torch's torch.ops has another shape: packages are adopted only when "
                    "imported, never on first touch")
    state = process()
    state.adopter = adopter
    if adopter._vetoes:
        torch_state.recorder().veto = adopter.veto
    adopter.eager(plan)
    return adopter


def deactivate(adopter: Adopter | None) -> None:
    """Stop ``adopter`` (the registry unloads): no more imports on first touch, no vetoes."""
    state = process()
    if adopter is None or state.adopter is not adopter:
        return
    state.adopter = None
    if state.recorder is not None and state.recorder.veto == adopter.veto:
        state.recorder.veto = None


def _missing_because(namespace: str, owners: list[tuple[Adopted, str]],
                     errors: dict[tuple[str, str], str], verdicts: dict[str, str | None],
                     left_behind: dict[tuple[str, str], str]) -> str | None:
    """Why ops of ``namespace`` may be missing: a module of an adopted package that registers
    in it, or defines one of its ops, failed to import (or is left behind by its package's
    failed import: the package's error), or the lock refused the package; ``None``
    otherwise."""
    why: dict[str, None] = {}  # in order, once each
    for adopted, module in owners:
        module = left_behind.get((adopted.name, module), module)
        where = f"{adopted.distribution.text}, adopted by opregistry for torch.ops.{namespace}"
        error = errors.get((adopted.name, module))
        if error is not None:
            why[f"{where}, failed to import (importing {module}: {error}); import {module} "
                f"yourself to see the whole error"] = None
        elif verdicts.get(adopted.name):
            why[f"{where}, was not imported: the lock refuses it "
                f"({verdicts[adopted.name]})"] = None
    return "; ".join(why) or None
