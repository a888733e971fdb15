"""The registration program: a cached plan's registrations as data, replayed without its records.

A warm ``import torch`` (a plan-cache hit) registers what the cached plan
says.  Decoded as a :class:`~opregistry.plans.Plan` and turned into
:class:`~opregistry.steps.Steps`, that is ~150,000 records for 10,000 ops,
made and dropped at every start.  The program is the same registrations,
in the executor's order (:func:`opregistry.steps.plan_steps`), written into
the plan-cache entry next to the plan: each op's declaration row and each
kernel's, with the backend that registers it.  Replayed
(:func:`opregistry.materializer.replay`), it builds only what torch and the
backends' hooks are given: an :class:`~opregistry.model.OpDef` per op and a
:class:`~opregistry.model.Kernel` and its payload per kernel.

A program is written only for a plan whose registrations are all plain --
``define`` and ``register`` steps: no native library, no op routed by its
device argument, no chain of candidates, no kernel waiting for a package's
import -- and that has no error (a load logs those; warnings and notes are
the plan's, read when it is).  The replay fails and rolls back as the
executor does: a distribution whose kernel module fails to import, or whose
registration torch refuses, is left out whole with those that implement its
ops, and the others stay registered.  A program it cannot read (another
opregistry's) is not replayed: nothing is registered from it, and the load
registers the decoded plan.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from .codec import Encoder
from .model import Kernel, OpDef
from .plans import Plan
from .steps import Steps

__all__ = ["VERSION", "SAME_AS_OP", "NO_EXTRAS", "compile_program"]

#: the layout of the rows below; a program of another version is not replayed
VERSION = 2

#: the actions a program holds; a plan with any other step has no program
_PLAIN = frozenset({"define", "register"})
#: a kernel's ``override``, ``when``, ``predicate`` and ``priority`` when it sets none
NO_EXTRAS = (False, None, None, 0)
#: a kernel row's ``op`` or ``source`` that is its op's
SAME_AS_OP = 1


def compile_program(plan: Plan, steps: Steps, enc: Encoder, declarations: Mapping[str, Any]
                    ) -> dict[str, Any] | None:
    """``plan``'s registrations as data, or ``None`` when they are not all plain (see above).

    ``steps``: the plan's (:func:`~opregistry.steps.plan_steps`); ``enc``: the
    encoder of the entry, which encoded ``declarations`` last (its origins
    table names the rows' distributions, and the rows of the declared ops and
    kernels are taken from ``declarations``, not encoded again).  Layout:

    * ``ops``: each defined op's row (:meth:`Encoder.op`), in the plan's order;
    * ``kernels``: each registered kernel, in the executor's order, as
      ``[at, backend, op, key, payload, source, origin, *extras]``: ``at`` the
      index of its op in ``ops`` (``-1``: an op opregistry does not define),
      the others the fields of its :meth:`Encoder.kernel` row, ``op`` and
      ``source`` ``1`` when they are its op's, ``extras`` (``override``,
      ``when``, ``predicate``, ``priority``) left out when none is set;
      ``backend`` and ``key`` are indices into ``names``, ``payload`` into
      ``payloads``;
    * ``names``: the backend and key names, each once; ``payloads``: each
      distinct payload row (:meth:`Encoder.payload`) once -- 10,000 ops
      whose kernels are the same four functions have four, parsed and
      decoded once, not 40,000 times;
    * ``libraries``: ``[distribution, namespace, kind]`` for each ``Library`` a
      distribution opens as DEF or FRAGMENT (any other is opened as IMPL);
    * ``sites``: ``[distribution, namespace, site]``, where each ``Library`` is
      said to be created (:attr:`opregistry.steps.Steps.sites`);
    * ``watched``, ``backends`` (``[distribution, name]`` of each backend the
      plan chose), ``adoptions`` (whether the plan adopts a package: its
      adopter needs the decoded plan).
    """
    if plan.natives or any(p.severity == "error" for p in plan.problems):
        return None
    op_row, kernel_row = _rows(enc, declarations)
    op_index: dict[int, int] = {}  # id of an OpPlan -> its row
    ops: list[Any] = []
    kernels: list[Any] = []
    names, payloads = _Table(), _Table()
    for step in steps.steps:
        if step.action not in _PLAIN:
            return None
        if step.action == "define":
            op_index[id(step.subject)] = len(ops)
            ops.append(op_row(step.subject.op))
            continue
        op, planned = step.subject
        if planned.after is not None:
            return None
        kernel = planned.kernel
        name, key, payload, *extras, source, origin = kernel_row(kernel)
        at = op_index.get(id(op), -1) if op is not None else -1
        if at >= 0:  # most kernels are declared with their op, at its line
            name = SAME_AS_OP if name == op.op.qualname else name
            source = SAME_AS_OP if source == ops[at][8] else source
        kernels.append([at, names.at(planned.backend), name, names.at(key),
                        payloads.at(payload), source, origin,
                        *(extras if tuple(extras) != NO_EXTRAS else ())])
    libraries = []
    for dist, owned in sorted(steps.owned.items()):
        for namespace, kind in sorted(owned.items()):
            libraries.append([dist, namespace, kind])
    sites = [[dist, namespace, site] for (dist, namespace), site in sorted(steps.sites.items())]
    return {"version": VERSION, "ops": ops, "kernels": kernels, "names": names.rows,
            "payloads": payloads.rows, "libraries": libraries,
            "sites": sites, "watched": sorted(steps.watched),
            "backends": [[b.backend.origin.distribution, b.backend.name] for b in plan.backends
                         if b.backend.origin is not None],
            "adoptions": bool(plan.adoptions)}


class _Table:
    """Distinct values, each once, by index: names, and payload rows (lists of strings and
    ``None`` for the built-in kinds, of any JSON for a backend's own)."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self._at: dict[Any, int] = {}
        #: id of a row met before -> (the row, its index): the encoder shares one payload
        #: row between the kernels that share the payload
        self._seen: dict[int, tuple[Any, int]] = {}

    def at(self, value: Any) -> int:
        if type(value) is str:
            key: Any = value
        elif type(value) is list:
            seen = self._seen.get(id(value))
            if seen is not None and seen[0] is value:
                return seen[1]
            found = self._seen_at(value)
            self._seen[id(value)] = (value, found)
            return found
        else:
            key = json.dumps(value, sort_keys=True)
        return self._add(key, value)

    def _seen_at(self, value: list[Any]) -> int:
        if all(v is None or type(v) is str for v in value):
            return self._add(tuple(value), value)
        # any other JSON (1 and True, equal as Python values, differ as JSON)
        return self._add(json.dumps(value, sort_keys=True), value)

    def _add(self, key: Any, value: Any) -> int:
        found = self._at.get(key)
        if found is None:
            found = self._at[key] = len(self.rows)
            self.rows.append(value)
        return found


def _rows(enc: Encoder, declarations: Mapping[str, Any]
          ) -> tuple[Callable[[OpDef], list[Any]], Callable[[Kernel], list[Any]]]:
    """The row of a declared op and kernel as ``declarations`` holds it, else encoded."""
    ops, kernels = declarations["ops"], declarations["kernels"]
    op_at, kernel_at = enc.indices()

    def op_row(op: OpDef) -> list[Any]:
        at = op_at.get(id(op))
        return ops[at] if at is not None else enc.op(op)

    def kernel_row(kernel: Kernel) -> list[Any]:
        at = kernel_at.get(id(kernel))
        return kernels[at] if at is not None else enc.kernel(kernel)

    return op_row, kernel_row
