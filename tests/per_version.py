"""What the installed example distributions do on the torch that runs the tests.

The suite runs on the pinned torch and, in CI's compatibility pass, on the
floor and the newest release of the supported range.  nnkit declares
``silu_and_mul.out``, tagged ``out`` (a ``torch.Tag`` from torch 2.13), only
where the installed torch has that tag, so it loads on every supported
release; were it to declare a tag the installed torch lacks, the resolver would refuse nnkit
whole (``op-tag-needs-newer-torch``), and nnkit-contrib, whose kernels are for
nnkit's ops, with it (``kernel-for-undefined-op``).  The expectations here are
derived from the same facts the resolver uses -- the tags nnkit declares and
the installed torch's tags (``keys.installed_torch()``) -- so a test that uses
them still fails if opregistry refuses too much, too little, or says it
differently.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

import pytest

from opregistry.keys import installed_torch, tag_since

_FACTS = installed_torch()
assert _FACTS is not None, "the tests run with torch installed"
TORCH = _FACTS.version
#: the installed torch's tags (torch.Tag members), read from its files
TORCH_TAGS: frozenset[str] = _FACTS.tags


def release() -> tuple[int, int]:
    """The installed torch's ``(major, minor)``."""
    return _FACTS.release


def _nnkit_tags() -> frozenset[str]:
    from nnkit.registry import lib

    return frozenset(t for op in lib.opregistry_ops() for t in op.tags)


#: the tags nnkit declares that the installed torch lacks (``["out"]`` on torch < 2.13)
NNKIT_LACKS: list[str] = sorted(_nnkit_tags() - _FACTS.tags)
#: whether nnkit (and nnkit-contrib with it) is refused on this torch
NNKIT_REFUSED = bool(NNKIT_LACKS)
#: the release nnkit needs, when this one is too old
NNKIT_NEEDS = max((tag_since(t) or "0.0" for t in NNKIT_LACKS),
                  key=lambda v: tuple(map(int, v.split("."))), default=None)
#: the distributions left out on this torch
REFUSED_DISTRIBUTIONS: frozenset[str] = frozenset({"nnkit", "nnkit-contrib"} if NNKIT_REFUSED
                                                  else ())
#: ``(code, distribution)`` of every error a load of the installed distributions has here
EXPECTED_ERRORS: frozenset[tuple[str, str]] = frozenset(
    {("op-tag-needs-newer-torch", "nnkit"), ("kernel-for-undefined-op", "nnkit-contrib")}
    if NNKIT_REFUSED else ())


def _fields(problem: Any) -> tuple[str, str, list[str], str]:
    """code, severity, distribution names, message -- of a Problem or its ``to_dict()``."""
    if isinstance(problem, dict):
        names = [d["name"] if isinstance(d, dict) else d.partition("==")[0]
                 for d in problem.get("distributions", ())]
        return problem["code"], problem["severity"], names, problem["message"]
    return (problem.code, problem.severity, [o.distribution for o in problem.culprits],
            problem.message)


def error_codes(problems: Iterable[Any]) -> set[tuple[str, str]]:
    """``(code, distribution)`` of the errors among ``problems``."""
    found = set()
    for problem in problems:
        code, severity, names, _ = _fields(problem)
        if severity == "error":
            found |= {(code, name) for name in names}
    return found


def check_installed_errors(problems: Iterable[Any]) -> None:
    """The errors are exactly the ones this torch must give (none on torch >= 2.13)."""
    problems = list(problems)
    assert error_codes(problems) == EXPECTED_ERRORS, [_fields(p) for p in problems]
    for problem in problems:
        code, _, _, message = _fields(problem)
        if code == "op-tag-needs-newer-torch":
            assert f"installed torch ({TORCH})" in message, message
            assert f"exists from torch {NNKIT_NEEDS}" in message, message


def need_nnkit(problems: Iterable[Any] | None = None) -> None:
    """A test of nnkit's ops: on a torch nnkit needs a newer release of, check that it is
    refused as it must be (when ``problems`` are given) and skip the rest of the test."""
    if not NNKIT_REFUSED:
        return
    if problems is not None:
        check_installed_errors(problems)
    pytest.skip(f"nnkit needs torch >= {NNKIT_NEEDS} (tags {NNKIT_LACKS}); this is {TORCH}, "
                f"which refuses it{' (checked)' if problems is not None else ''}")


def block_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test of the repo's environment as a whole (``opregistry list`` exits 0, ...):
    on a torch that refuses nnkit, check that it is refused exactly as it must be, then
    block the refused distributions (``OPREGISTRY_BLOCK``) so that the rest is tested."""
    if not NNKIT_REFUSED:
        return
    import opregistry

    check_installed_errors(opregistry.plan().problems)
    monkeypatch.setenv("OPREGISTRY_BLOCK", ",".join(sorted(REFUSED_DISTRIBUTIONS)))


@functools.lru_cache(maxsize=None)
def records_registration_sites() -> bool:
    """Whether this torch records which file registered a kernel from Python (2.9 and later
    do; 2.8 writes ``/dev/null:LINE`` for all): what ``Registry.drift`` needs to attribute a
    replaced kernel.  Probed with a throw-away ``Library``."""
    import uuid

    import torch

    from opregistry import torch_state

    ns = f"probe{uuid.uuid4().hex[:10]}"
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("f(Tensor x) -> Tensor")
        lib.impl("f", lambda x: x, "CPU")
        where = torch_state.kernel_registrations(f"{ns}::f")["CPU"]
    finally:
        lib._destroy()
    recorded = torch_state.site_recorded(where)
    assert recorded == where.startswith(__file__ + ":"), where
    return recorded
