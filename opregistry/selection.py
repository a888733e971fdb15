"""Kernel candidates: load-time conditions, per-call conditions, and the chain that tries them.

Several kernels may serve one (op, dispatch key) as *candidates*, each with
conditions (:class:`~opregistry.model.Condition`; see ``docs/op-authors.md``):

* checked once, when the registry is resolved, without importing torch or
  the package named: the torch version (read from its files), Python
  packages (``importlib-metadata``), the platform (``sys.platform``);
* checked per call: the CUDA compute capability of the call's device (read
  on the first call on each device, then cached: CUDA is never initialized
  by opregistry at ``import torch``) and a predicate on the call's arguments.

:func:`chain` builds the one function torch's dispatcher calls for such an
(op, key): it tries the candidates in order and runs the first that
accepts the call.  A single candidate with no per-call condition is
registered as is: nothing is added to its calls.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from attrs import frozen

from .conditions import Condition
from .containment import must_propagate
from .references import describe_ref
from .state import process

__all__ = ["chain", "Step", "counted", "observer", "kernel_counts", "KernelCounts",
           "counting_forced", "print_counts_at_exit"]


@frozen
class Step:
    """One candidate of a chain: the kernel and what it needs of a call (``None``: nothing)."""

    fn: Callable[..., Any]
    predicate: Callable[..., Any] | None = None
    capability: str | None = None
    label: str = ""


def _declined(label: str, qualname: str) -> Callable[[BaseException], bool]:
    """What an exception from a predicate means: the call is declined (reported once).

    The next candidate computes the same op, so falling back is safe; failing
    the user's call for a bug in a package's predicate is not.  A real
    Ctrl-C (and ``SystemExit``) still propagates.
    """
    reported: list[bool] = []

    def declined(exc: BaseException) -> bool:
        if must_propagate(exc):
            raise exc
        if not reported:
            reported.append(True)
            import warnings

            warnings.warn(
                f"opregistry: the predicate {label} for {qualname} raised "
                f"{type(exc).__name__}: {exc}; the next candidate serves the call (and every "
                f"call it raises on; reported once)", RuntimeWarning, stacklevel=3)
        return False

    return declined


def _contained(predicate: Callable[..., Any], label: str, qualname: str) -> Callable[..., bool]:
    """``predicate``, an exception from which declines the call instead of failing it.

    The warning names the predicate (``module:function``) and the candidate it
    guards: the function whose bug it is, and the kernel that did not serve.
    """
    declined = _declined(f"{describe_ref(predicate)} of the candidate {label}", qualname)

    def accepts(*args: Any, **kwargs: Any) -> bool:
        try:
            return bool(predicate(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - a package's predicate, contained
            return declined(exc)

    return accepts


def _checks(qualname: str, steps: Sequence[Step]
            ) -> list[tuple[Callable[..., bool] | None, Callable[..., Any]]]:
    """``(accepts, fn)`` per step, up to the first that accepts every call (``accepts=None``)."""
    checks: list[tuple[Callable[..., bool] | None, Callable[..., Any]]] = []
    for step in steps:
        tests = []
        if step.capability is not None:
            tests.append(Condition(capability=step.capability).capability_check())
        if step.predicate is not None:
            tests.append(_contained(step.predicate, step.label, qualname))
        if not tests:
            checks.append((None, step.fn))
            break
        if len(tests) == 1:
            checks.append((tests[0], step.fn))
        else:
            first, second = tests
            checks.append((lambda *a, _f=first, _s=second, **k: _f(*a, **k) and _s(*a, **k),
                           step.fn))
    return checks


def _predicate_or_fallback(qualname: str, first: Step, fallback: Callable[..., Any],
                           keywords: bool) -> Callable[..., Any]:
    """The common case, a fast kernel with a predicate and a fallback: one predicate call
    per call, the exception handling inline (free in Python >= 3.11)."""
    predicate, fast = first.predicate, first.fn
    declined = _declined(f"{describe_ref(predicate)} of the candidate {first.label}", qualname)
    assert predicate is not None

    if keywords:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            try:
                ok = predicate(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - a package's predicate, contained
                ok = declined(exc)
            if ok:
                return fast(*args, **kwargs)
            return fallback(*args, **kwargs)
        return kernel

    def positional(*args: Any) -> Any:
        try:
            ok = predicate(*args)
        except BaseException as exc:  # noqa: BLE001 - a package's predicate, contained
            ok = declined(exc)
        if ok:
            return fast(*args)
        return fallback(*args)
    return positional


def chain(qualname: str, key: str, steps: Sequence[Step],
          observe: Callable[[int], None] | None = None, *,
          keywords: bool = True) -> Callable[..., Any]:
    """The function torch calls for (``qualname``, ``key``): the first candidate that accepts.

    A step without per-call conditions accepts every call, so nothing after
    it is ever tried; a single such step is returned as is.  When every step
    declines, the call raises ``NotImplementedError`` naming them.
    ``observe(i)``, when given, is told the index of the step that ran.
    ``keywords=False`` (an op without keyword-only arguments: torch then
    calls its kernels with positional arguments only) spares the common
    case packing and passing an empty ``**kwargs``.
    """
    checks = _checks(qualname, steps)
    labels = [s.label for s in steps[:len(checks)]]
    if observe is None and len(checks) == 1 and checks[0][0] is None:
        return checks[0][1]
    first = steps[0]
    if (observe is None and len(checks) == 2 and checks[1][0] is None
            and first.capability is None and first.predicate is not None):
        kernel = _predicate_or_fallback(qualname, first, checks[1][1], keywords)
    else:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            for index, (accepts, fn) in enumerate(checks):
                if accepts is None or accepts(*args, **kwargs):
                    if observe is not None:
                        observe(index)
                    return fn(*args, **kwargs)
            raise NotImplementedError(
                f"{qualname}: no {key} kernel accepts this call; every candidate's condition "
                f"declined it: {', '.join(labels)}")

    kernel.__qualname__ = kernel.__name__ = f"candidates[{qualname}/{key}]"
    return kernel


# -- which kernel ran ------------------------------------------------------------------
#
# Counting is decided when kernels are registered: off (the default), the function
# torch calls is the kernel itself, so it costs nothing; on (OPREGISTRY_KERNEL_COUNTS=1,
# or a load inside kernel_counts()), each device kernel is registered through a counting
# wrapper and each chain of candidates reports the one that ran.

def counting_forced() -> bool:
    """Whether a :func:`kernel_counts` block asks the next load to count."""
    return process().counting_blocks > 0


def counted(qualname: str, key: str, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, counting its calls under (``qualname``, ``key``, ``label``)."""
    slot = (qualname, key, label)
    state = process()
    calls = state.calls
    calls.setdefault(slot, 0)
    state.counting_registered += 1

    def kernel(*args: Any, **kwargs: Any) -> Any:
        calls[slot] += 1
        return fn(*args, **kwargs)

    kernel.__qualname__ = kernel.__name__ = f"counted[{qualname}/{key}]"
    return kernel


def observer(qualname: str, key: str, labels: Sequence[str]) -> Callable[[int], None]:
    """The ``observe`` of :func:`chain`: counts the candidate that ran, and fallbacks."""
    state = process()
    calls, fallbacks = state.calls, state.fallbacks
    slots = [(qualname, key, label) for label in labels]
    for slot in slots:
        calls.setdefault(slot, 0)
    pair = (qualname, key)
    fallbacks.setdefault(pair, 0)
    state.counting_registered += 1

    def observe(index: int) -> None:
        calls[slots[index]] += 1
        if index:
            fallbacks[pair] += 1

    return observe


class KernelCounts:
    """Which kernel served each op call in a :func:`kernel_counts` block, and fallbacks taken.

    ``rows``: ``(op, key, kernel, calls, fallbacks)``, for every counted kernel
    (``fallbacks``: calls of that (op, key) that a later candidate served);
    ``str()`` is the table.  ``counting`` says whether kernels were registered
    counting: if not, the rows are empty.
    """

    def __init__(self) -> None:
        self.counting = False
        self._start: dict[Any, int] = {}
        self._start_fallbacks: dict[Any, int] = {}
        self._registered_before = 0
        self.rows: list[tuple[str, str, str, int, int]] = []

    def _begin(self) -> None:
        state = process()
        self._start, self._start_fallbacks = dict(state.calls), dict(state.fallbacks)
        self._registered_before = state.counting_registered

    def _end(self) -> None:
        state = process()
        self.rows = []
        for (op, key, label), n in sorted(state.calls.items()):
            calls = n - self._start.get((op, key, label), 0)
            fallbacks = (state.fallbacks.get((op, key), 0)
                         - self._start_fallbacks.get((op, key), 0))
            if calls:
                self.rows.append((op, key, label, calls, fallbacks))
        # counting, for this block: its calls reached counting kernels, it loaded counting,
        # or the switch says every load counts -- not whether some earlier load in the
        # process counted (the counters are process-wide)
        self.counting = bool(self.rows) or state.counting_registered > self._registered_before \
            or _switch_on()

    def table(self) -> str:
        if not self.counting:
            return ("kernel counts: off (set OPREGISTRY_KERNEL_COUNTS=1 before import torch, "
                    "or load inside opregistry.kernel_counts())")
        header = ("OP", "KEY", "KERNEL", "CALLS", "FALLBACKS")
        rows = [header] + [(o, k, label, str(c), str(f)) for o, k, label, c, f in self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join(lines) if self.rows else lines[0] + "\n(no op calls counted)"

    def __str__(self) -> str:
        return self.table()


def _switch_on() -> bool:
    import os

    from .variables import COUNTS_VAR, parse_flag

    try:
        return parse_flag(os.environ.get(COUNTS_VAR), False, COUNTS_VAR)
    except Exception:  # noqa: BLE001 - an invalid value is reported where it is read at load
        return False


class kernel_counts:  # noqa: N801 - a context manager, used as ``with opregistry.kernel_counts()``
    """Count, for the calls made inside the block, which kernel served each op call.

    ``with opregistry.kernel_counts() as counts: ...`` then ``print(counts)``.
    Counting needs kernels registered counting: with ``OPREGISTRY_KERNEL_COUNTS=1``
    set before ``import torch``, or when the registry is loaded inside the block
    (``import torch`` or ``opregistry.load()`` there).  Otherwise the block
    counts nothing and says so: kernels registered without counting cost nothing.
    """

    def __enter__(self) -> KernelCounts:
        process().counting_blocks += 1
        self.counts = KernelCounts()
        self.counts._begin()
        return self.counts

    def __exit__(self, *exc: object) -> None:
        process().counting_blocks -= 1
        self.counts._end()


def print_counts_at_exit() -> None:
    """At interpreter exit, the whole run's table on stderr (``OPREGISTRY_KERNEL_COUNTS=1``)."""
    import atexit

    state = process()
    if state.counts_printed_at_exit:
        return
    state.counts_printed_at_exit = True
    whole = KernelCounts()

    def report() -> None:
        whole._end()
        sys.stderr.write("opregistry: which kernel served each op call\n" + whole.table() + "\n")

    atexit.register(report)
