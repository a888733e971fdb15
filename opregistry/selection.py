"""Kernel candidates: load-time conditions, per-call conditions, and the chain that tries them.

Several kernels may serve one (op, dispatch key) as *candidates*, each with
conditions (``docs/op-authors.md#several-kernels-for-one-device``):

* checked once, when the registry is resolved, without importing torch or
  the package named: the torch version (read from its files), Python
  packages (``importlib.metadata``), the platform (``sys.platform``);
* checked per call: the CUDA compute capability of the call's device (read
  on the first call on each device, then cached: CUDA is never initialized
  by opregistry at ``import torch``) and a predicate on the call's arguments.

:func:`chain` builds the one function torch's dispatcher calls for such an
(op, key): it tries the candidates in order and runs the first that
accepts the call.  A single candidate with no per-call condition is
registered as is: nothing is added to its calls.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
from attrs import field, frozen

from .containment import must_propagate
from .errors import DeclarationError

__all__ = ["Condition", "parse_range", "in_range", "parse_requirement", "chain", "Step",
           "ordinal", "counted", "observer", "kernel_counts", "KernelCounts",
           "counting_forced", "print_counts_at_exit"]

_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*\Z")
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(.*)\Z")
_RELEASE = re.compile(r"\d+(?:\.\d+)*")
_COMPARE: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
}
_EXAMPLE = "'>=2.10,<2.15'"


def parse_range(text: str, what: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``">=2.10,<2.15"`` as ``((">=", (2, 10)), ("<", (2, 15)))``.

    The subset of PEP 440 specifiers conditions need: comparisons of release
    numbers, joined by commas.  Anything else is a :class:`DeclarationError`.
    """
    if not isinstance(text, str) or not text.strip():
        raise DeclarationError(f"{what}: {text!r} is not a version range; write e.g. {_EXAMPLE}")
    clauses = []
    for part in text.split(","):
        found = _CLAUSE.match(part)
        if found is None:
            raise DeclarationError(
                f"{what}: {part.strip()!r} in {text!r} is not a version comparison; write "
                f"e.g. {_EXAMPLE} (operators >=, <=, ==, !=, >, <; release numbers only)")
        clauses.append((found.group(1), tuple(int(p) for p in found.group(2).split("."))))
    return tuple(clauses)


def in_range(version: str | tuple[int, ...], clauses: Iterable[tuple[str, tuple[int, ...]]]) -> bool:
    """Whether ``version`` (``"2.13.0+cpu"`` or a tuple) satisfies every clause."""
    if isinstance(version, str):
        found = _RELEASE.match(version)
        release: tuple[int, ...] = tuple(int(p) for p in found.group(0).split(".")) if found else ()
    else:
        release = tuple(version)
    for op, wanted in clauses:
        width = max(len(release), len(wanted))
        a = release + (0,) * (width - len(release))
        b = wanted + (0,) * (width - len(wanted))
        if not _COMPARE[op](a, b):
            return False
    return True


def parse_requirement(text: str) -> tuple[str, str]:
    """``"triton>=3.2"`` as ``("triton", ">=3.2")``; the range may be empty."""
    found = _NAME.match(text) if isinstance(text, str) else None
    if found is None:
        raise DeclarationError(
            f"requires: {text!r} is not a requirement; write e.g. 'triton>=3.2'")
    name, spec = found.group(1), found.group(2).strip()
    if spec:
        parse_range(spec, f"requires {text!r}")
    return name, spec


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise DeclarationError(f"{what} must be a string or a list of strings, not {value!r}")


@frozen(kw_only=True)
class Condition:
    """When a kernel candidate may serve: all of the given conditions must hold.

    :param torch: torch versions, ``">=2.10,<2.15"`` (read from torch's files).
    :param requires: installed Python distributions, ``["triton>=3.2"]``
        (``importlib.metadata``; nothing is imported).
    :param capability: CUDA compute capability of the call's device,
        ``">=9.0"`` (a CUDA kernel only; read on the first call on each device).
    :param platform: ``sys.platform`` prefixes, ``"linux"`` or ``["linux", "win32"]``.
    """

    torch: str | None = None
    requires: tuple[str, ...] = field(default=(), converter=lambda v: _strings(v, "requires"))
    capability: str | None = None
    platform: tuple[str, ...] = field(default=(), converter=lambda v: _strings(v, "platform"))

    def __attrs_post_init__(self) -> None:
        if self.torch is not None:
            parse_range(self.torch, "torch")
        for requirement in self.requires:
            parse_requirement(requirement)
        if self.capability is not None:
            parse_range(self.capability, "capability")

    @classmethod
    def of(cls, value: Condition | Mapping[str, Any] | None) -> Condition | None:
        """A :class:`Condition` from itself or a mapping of its fields (``when={...}``)."""
        if value is None or isinstance(value, Condition):
            return value
        if not isinstance(value, Mapping):
            raise DeclarationError(
                f"when= must be a dict (torch, requires, capability, platform) or an "
                f"opregistry.Condition, not {type(value).__name__}")
        unknown = sorted(set(value) - {f.name for f in attrs.fields(cls)})
        if unknown:
            raise DeclarationError(
                f"when= has unknown condition(s) {unknown}; known: torch, requires, "
                f"capability, platform")
        return cls(**value)

    def describe(self) -> str:
        parts = []
        if self.torch:
            parts.append(f"torch{self.torch}")
        parts += list(self.requires)
        if self.capability:
            parts.append(f"capability{self.capability}")
        if self.platform:
            parts.append("platform " + "|".join(self.platform))
        return ", ".join(parts)

    def unmet(self, torch_version: str | None) -> str | None:
        """Why the load-time conditions fail here, or ``None`` when they hold."""
        from importlib import metadata

        if self.torch is not None:
            if torch_version is None:
                return "torch is not installed"
            if not in_range(torch_version, parse_range(self.torch, "torch")):
                return f"torch {torch_version} is not {self.torch}"
        for requirement in self.requires:
            name, spec = parse_requirement(requirement)
            try:
                installed = metadata.version(name)
            except metadata.PackageNotFoundError:
                return f"{name} is not installed (needs {requirement})"
            if spec and not in_range(installed, parse_range(spec, requirement)):
                return f"{name} {installed} is not {spec}"
        if self.platform and not any(sys.platform.startswith(p) for p in self.platform):
            return f"platform {sys.platform} is not {'|'.join(self.platform)}"
        return None


def ordinal(n: int) -> str:
    return f"{n}{'tsnrhtdd'[(n // 10 % 10 != 1) * (n % 10 < 4) * n % 10::4]}"


@frozen
class Step:
    """One candidate of a chain: the kernel and what it needs of a call (``None``: nothing)."""

    fn: Callable[..., Any]
    predicate: Callable[..., Any] | None = None
    capability: str | None = None
    label: str = ""


def _capability_check(spec: str) -> Callable[..., bool]:
    """Whether the first CUDA tensor's device has a capability in ``spec``; cached per device."""
    clauses = parse_range(spec, "capability")
    cache: dict[int, bool] = {}

    def accepts(*args: Any, **kwargs: Any) -> bool:
        import torch

        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                index = value.device.index if value.device.index is not None else \
                    torch.cuda.current_device()
                found = cache.get(index)
                if found is None:
                    found = cache[index] = in_range(
                        torch.cuda.get_device_capability(index), clauses)
                return found
        return False

    return accepts


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
                f"opregistry: the per-call condition of {label} for {qualname} raised "
                f"{type(exc).__name__}: {exc}; the next candidate serves the call (and every "
                f"call it raises on; reported once)", RuntimeWarning, stacklevel=3)
        return False

    return declined


def _contained(predicate: Callable[..., Any], label: str, qualname: str) -> Callable[..., bool]:
    """``predicate``, an exception from which declines the call instead of failing it."""
    declined = _declined(label, qualname)

    def accepts(*args: Any, **kwargs: Any) -> bool:
        try:
            return bool(predicate(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - a package's predicate, contained
            return declined(exc)

    return accepts


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
    checks: list[tuple[Callable[..., bool] | None, Callable[..., Any]]] = []
    for step in steps:
        tests = []
        if step.capability is not None:
            tests.append(_capability_check(step.capability))
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
    labels = [s.label for s in steps[:len(checks)]]

    def none_accepts(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{qualname}: no {key} kernel accepts this call; every candidate's condition "
            f"declined it: {', '.join(labels)}")

    if observe is None and len(checks) == 1 and checks[0][0] is None:
        return checks[0][1]
    first = steps[0]
    if (observe is None and len(checks) == 2 and checks[1][0] is None
            and first.capability is None and first.predicate is not None):
        # the common case, a fast kernel with a predicate and a fallback: one predicate
        # call per call, the exception handling inline (free in Python >= 3.11)
        predicate, fast, fallback = first.predicate, first.fn, checks[1][1]
        declined = _declined(first.label, qualname)

        if keywords:
            def kernel(*args: Any, **kwargs: Any) -> Any:
                try:
                    ok = predicate(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - a package's predicate, contained
                    ok = declined(exc)
                if ok:
                    return fast(*args, **kwargs)
                return fallback(*args, **kwargs)
        else:
            def kernel(*args: Any) -> Any:  # type: ignore[misc]
                try:
                    ok = predicate(*args)
                except BaseException as exc:  # noqa: BLE001 - a package's predicate, contained
                    ok = declined(exc)
                if ok:
                    return fast(*args)
                return fallback(*args)
    else:
        tail = none_accepts

        def kernel(*args: Any, **kwargs: Any) -> Any:
            for index, (accepts, fn) in enumerate(checks):
                if accepts is None or accepts(*args, **kwargs):
                    if observe is not None:
                        observe(index)
                    return fn(*args, **kwargs)
            return tail(*args, **kwargs)

    kernel.__qualname__ = kernel.__name__ = f"candidates[{qualname}/{key}]"
    return kernel


# -- which kernel ran ------------------------------------------------------------------
#
# Counting is decided when kernels are registered: off (the default), the function
# torch calls is the kernel itself, so it costs nothing; on (OPREGISTRY_KERNEL_COUNTS=1,
# or a load inside kernel_counts()), each device kernel is registered through a counting
# wrapper and each chain of candidates reports the one that ran.

#: (op, key, kernel label) -> calls; (op, key) -> calls a candidate after the first served
_calls: dict[tuple[str, str, str], int] = {}
_fallbacks: dict[tuple[str, str], int] = {}
_forced: list[bool] = []


def counting_forced() -> bool:
    """Whether a :func:`kernel_counts` block asks the next load to count."""
    return bool(_forced)


def counted(qualname: str, key: str, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, counting its calls under (``qualname``, ``key``, ``label``)."""
    slot = (qualname, key, label)
    _calls.setdefault(slot, 0)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        _calls[slot] += 1
        return fn(*args, **kwargs)

    kernel.__qualname__ = kernel.__name__ = f"counted[{qualname}/{key}]"
    return kernel


def observer(qualname: str, key: str, labels: Sequence[str]) -> Callable[[int], None]:
    """The ``observe`` of :func:`chain`: counts the candidate that ran, and fallbacks."""
    slots = [(qualname, key, label) for label in labels]
    for slot in slots:
        _calls.setdefault(slot, 0)
    pair = (qualname, key)
    _fallbacks.setdefault(pair, 0)

    def observe(index: int) -> None:
        _calls[slots[index]] += 1
        if index:
            _fallbacks[pair] += 1

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
        self.rows: list[tuple[str, str, str, int, int]] = []

    def _begin(self) -> None:
        self._start, self._start_fallbacks = dict(_calls), dict(_fallbacks)

    def _end(self) -> None:
        self.counting = bool(_calls)
        self.rows = []
        for (op, key, label), n in sorted(_calls.items()):
            calls = n - self._start.get((op, key, label), 0)
            fallbacks = _fallbacks.get((op, key), 0) - self._start_fallbacks.get((op, key), 0)
            if calls:
                self.rows.append((op, key, label, calls, fallbacks))

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


class kernel_counts:  # noqa: N801 - a context manager, used as ``with opregistry.kernel_counts()``
    """Count, for the calls made inside the block, which kernel served each op call.

    ``with opregistry.kernel_counts() as counts: ...`` then ``print(counts)``.
    Counting needs kernels registered counting: with ``OPREGISTRY_KERNEL_COUNTS=1``
    set before ``import torch``, or when the registry is loaded inside the block
    (``import torch`` or ``opregistry.load()`` there).  Otherwise the block
    counts nothing and says so: kernels registered without counting cost nothing.
    """

    def __enter__(self) -> KernelCounts:
        _forced.append(True)
        self.counts = KernelCounts()
        self.counts._begin()
        return self.counts

    def __exit__(self, *exc: object) -> None:
        _forced.pop()
        self.counts._end()


def print_counts_at_exit() -> None:
    """At interpreter exit, the whole run's table on stderr (``OPREGISTRY_KERNEL_COUNTS=1``)."""
    import atexit

    if getattr(print_counts_at_exit, "registered", False):
        return
    print_counts_at_exit.registered = True  # type: ignore[attr-defined]
    whole = KernelCounts()

    def report() -> None:
        whole._end()
        sys.stderr.write("opregistry: which kernel served each op call\n" + whole.table() + "\n")

    atexit.register(report)
