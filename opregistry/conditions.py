"""When a kernel candidate may serve: :class:`Condition`, and the version ranges it is written in.

Several kernels may serve one (op, dispatch key) as *candidates*
(``docs/op-authors.md``), each with conditions.  A :class:`Condition` is
evaluated in one place for each moment it is about:

* at load, against the :class:`~opregistry.environment.Environment` the
  resolver is given (:meth:`Condition.unmet`): the installed torch, Python
  distributions, the platform -- read without importing torch or the
  packages named;
* per call, on the call's device (:meth:`Condition.capability_check`): the
  CUDA compute capability, read on the first call on each device.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping

import attrs
from attrs import field, frozen

from .errors import DeclarationError

__all__ = ["Condition", "parse_range", "in_range", "parse_requirement"]

_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*\Z")
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(.*)\Z")
_RELEASE = re.compile(r"\d+(?:\.\d+)*")
_CHECK = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")
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
        (importlib-metadata; nothing is imported).
    :param capability: CUDA compute capability of the call's device,
        ``">=9.0"`` (a CUDA kernel only; read on the first call on each device).
    :param platform: ``sys.platform`` prefixes, ``"linux"`` or ``["linux", "win32"]``.
    :param check: a function, ``"module:function"``, called once per load with no
        argument: true when the kernel may serve (a CPU feature is present, a
        native library loaded); it may return ``(value, reason)``.  A check
        that raises is unmet, with the exception as the reason.  Run when the
        registry loads, with torch imported (never by ``opregistry list``).
    """

    torch: str | None = None
    requires: tuple[str, ...] = field(default=(), converter=lambda v: _strings(v, "requires"))
    capability: str | None = None
    platform: tuple[str, ...] = field(default=(), converter=lambda v: _strings(v, "platform"))
    check: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.check is not None and (not isinstance(self.check, str)
                                       or not _CHECK.match(self.check)):
            raise DeclarationError(
                f"check: {self.check!r} is not a 'module:function' reference; write e.g. "
                f"'mylib.cpu_features:has_avx512' (a function of no argument, called at load)")
        self._check_ranges()

    def _check_ranges(self) -> None:
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
                f"when= must be a dict (torch, requires, capability, platform, check) or an "
                f"opregistry.Condition, not {type(value).__name__}")
        unknown = sorted(set(value) - {f.name for f in attrs.fields(cls)})
        if unknown:
            raise DeclarationError(
                f"when= has unknown condition(s) {unknown}; known: torch, requires, "
                f"capability, platform, check")
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
        if self.check:
            parts.append(f"check {self.check}")
        return ", ".join(parts)

    def held(self, env: Any) -> str:
        """:meth:`describe`, with what the check said in ``env``; a check not run is left out
        (:meth:`pending` says so)."""
        parts = [p for p in self.describe().split(", ") if p != f"check {self.check}"]
        outcome = env.check(self.check) if self.check else None
        if outcome is not None:
            parts.append(f"check {outcome[1]}")
        return ", ".join(parts)

    def pending(self, env: Any) -> str | None:
        """The check ``env`` has no outcome for (torch not imported), in words, or ``None``."""
        if self.check and env.check(self.check) is None:
            return (f"at load: check {self.check} (not run without torch; it runs when the "
                    f"registry loads)")
        return None

    @property
    def distributions(self) -> tuple[str, ...]:
        """The distributions :attr:`requires` names (what the environment must report)."""
        return tuple(parse_requirement(r)[0] for r in self.requires)

    def unmet(self, env: Any) -> str | None:
        """Why the load-time conditions fail in ``env``, or ``None`` when they hold.

        ``env`` is the resolver's :class:`~opregistry.environment.Environment`:
        nothing is read from the machine here.
        """
        torch_version = env.torch_version
        if self.torch is not None:
            if torch_version is None:
                return "torch is not installed"
            if not in_range(torch_version, parse_range(self.torch, "torch")):
                return f"torch {torch_version} is not {self.torch}"
        for requirement in self.requires:
            name, spec = parse_requirement(requirement)
            installed = env.version_of(name)
            if installed is None:
                return f"{name} is not installed (needs {requirement})"
            if spec and not in_range(installed, parse_range(spec, requirement)):
                return f"{name} {installed} is not {spec}"
        if self.platform and not any(env.platform.startswith(p) for p in self.platform):
            return f"platform {env.platform} is not {'|'.join(self.platform)}"
        if self.check:
            outcome = env.check(self.check)
            if outcome is not None and not outcome[0]:
                return f"check {outcome[1]}"
        return None

    def capability_check(self) -> Callable[..., bool] | None:
        """The per-call test of :attr:`capability`, or ``None`` without one.

        Whether the first CUDA tensor's device has a capability in range; read
        once per device, then cached (CUDA is never initialized by opregistry
        at ``import torch``).
        """
        if self.capability is None:
            return None
        clauses = parse_range(self.capability, "capability")
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
