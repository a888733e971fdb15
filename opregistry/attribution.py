"""Who registered each op and kernel in torch's dispatcher: the distribution, named as pip does.

torch records where each registration was made, but every Python
registration made through ``torch.library``'s functions is recorded inside
torch itself (``torch/library.py``), and a C++ one at the path of its source
file on the machine that built it.  So an op or kernel is attributed from,
in order:

1. opregistry's own plan: what opregistry registered for a distribution
   (its libraries are recorded at the declarations' lines);
2. the :class:`~opregistry.torch_state.Recorder`, which notes the first
   ``file:line`` outside torch of every registration made through
   ``torch.library`` after opregistry loaded: the file's distribution
   (:func:`opregistry.distfiles.owner_of`);
3. torch's own record, when it names a Python file outside torch;
4. for a C++ registration, the shared library that registers the namespace
   (the scan of installed files, :mod:`opregistry.scan`), among those this
   process loaded;
5. torch, for what torch's own files registered.

An owner is ``{"name", "version", "how"}``; ``how`` is ``opregistry``,
``python`` (with ``site``, the registering line), ``native`` (with ``site``,
the shared library) or ``torch``.  Imports torch.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from . import torch_state
from .distfiles import NATIVE_SUFFIXES, owner_of
from .plans import Plan
from .state import process

__all__ = ["Attributor"]

#: the slot the Recorder notes an op's definition under
_SCHEMA = "schema"


def _owner(dist: Any, how: str, site: str | None = None) -> dict[str, Any]:
    return {"name": dist.name, "version": dist.version, "how": how, "site": site}


class Attributor:
    """Names the distribution behind each op and kernel of the dispatcher (module docstring)."""

    def __init__(self, plan: Plan) -> None:
        self.ours = {op.op.qualname: op for op in plan.ops}
        self.library_sites = process().library_sites
        recorder = process().recorder
        self.sites: dict[tuple[str, str], str] = recorder.sites if recorder is not None else {}
        self.torch_root = torch_state.torch_dir()
        self._natives: dict[str, list[tuple[Any, str]]] | None = None
        self._lines: frozenset[str] | None = None

    def defined_by(self, op: str) -> dict[str, Any] | None:
        """The owner of the definition of ``op`` (``ns::name[.overload]``)."""
        mine = self.ours.get(op)
        if mine is not None and mine.op.origin is not None:
            o = mine.op.origin
            return {"name": o.distribution, "version": o.version, "how": "opregistry",
                    "site": mine.op.source}
        return self._from_site(op, self.sites.get((op, _SCHEMA)),
                               torch_state.definition_site(op))

    def kernel_by(self, op: str, key: str, site: str | None) -> dict[str, Any] | None:
        """The owner of ``op``'s kernel for ``key``, which torch records at ``site``."""
        mine = self.ours.get(op)
        recorded = self.sites.get((op, key)) or (self.sites.get((op, "Fake"))
                                                 if key == "Meta" else None)
        if (mine is not None and mine.op.origin is not None and site is not None
                and (site in self.library_sites
                     or (recorded is None and site in self._library_lines()))):
            o = mine.op.origin
            return {"name": o.distribution, "version": o.version, "how": "opregistry",
                    "site": site}
        return self._from_site(op, recorded, site)

    def _library_lines(self) -> frozenset[str]:
        """opregistry's libraries as a torch that records no Python file writes them
        (2.8: ``/dev/null:LINE``, the declaration's line): for an op opregistry defined,
        a kernel there that no package registered through ``torch.library`` is opregistry's."""
        if self._lines is None:
            self._lines = frozenset(f"/dev/null:{s.rpartition(':')[2]}"
                                    for s in self.library_sites)
        return self._lines

    def _from_site(self, op: str, recorded: str | None, torch_site: str | None
                   ) -> dict[str, Any] | None:
        for site in (recorded, torch_site):
            if not site or not torch_state.site_recorded(site):
                continue
            path = site.rpartition(":")[0]
            if path.startswith(self.torch_root):
                return {"name": "torch", "version": _torch_version(), "how": "torch",
                        "site": site}
            if os.path.exists(path):
                dist = owner_of(path)
                if dist is not None:
                    return _owner(dist, "python", site)
        return self._native(op.partition("::")[0])

    def _native(self, namespace: str) -> dict[str, Any] | None:
        """The distribution whose loaded shared library registers ``namespace``, if one does."""
        if self._natives is None:
            self._natives = _native_registrants()
        found = self._natives.get(namespace, [])
        loaded = [(d, f) for d, f in found if f in _loaded_libraries()]
        candidates = loaded or found
        if len({d.name for d, _ in candidates}) != 1:
            return None  # none, or several: nothing certain to say
        dist, file = candidates[0]
        return _owner(dist.distribution, "native", file)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _native_registrants() -> dict[str, list[tuple[Any, str]]]:
    """namespace -> ``(distribution, shared library)`` whose ``TORCH_LIBRARY*`` blocks name it."""
    from .scan import scan_installed

    found: dict[str, list[tuple[Any, str]]] = {}
    try:
        scan = scan_installed()
    except Exception:  # noqa: BLE001 - attribution is best effort: unknown, never a crash
        return found
    for dist, reg in scan.registrations():
        if not reg.namespace or reg.kind not in ("DEF", "FRAGMENT", "IMPL"):
            continue
        name = os.path.basename(reg.file)
        if name.endswith(NATIVE_SUFFIXES) or ".so." in name:
            found.setdefault(reg.namespace, []).append((dist, reg.file))
    return found


def _loaded_libraries() -> frozenset[str]:
    """The shared libraries this process loaded: /proc/self/maps, else extension modules."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return frozenset(line.split(None, 5)[5].strip() for line in fh
                             if len(line.split(None, 5)) == 6)
    except OSError:
        return frozenset(getattr(m, "__file__", "") or "" for m in list(sys.modules.values()))
