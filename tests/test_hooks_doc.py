"""docs/hooks.md documents every hook of opregistry/hookspecs.py, every argument, its semantics."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from opregistry import hookspecs

DOC = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"


def _hookspecs() -> list[tuple[str, list[str], bool]]:
    """(name, argument names, firstresult) of every hook specification."""
    found = []
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction):
        opts = getattr(fn, f"{hookspecs.PROJECT}_spec", None)
        if opts is None:
            continue
        found.append((name, list(inspect.signature(fn).parameters), bool(opts.get("firstresult"))))
    return found


def _sections() -> dict[str, str]:
    """Level-3 sections of docs/hooks.md by hook name: '### `name(args)`' -> body."""
    text = DOC.read_text()
    parts = re.split(r"^### `(opregistry_\w+)\(([^)]*)\)`\s*$", text, flags=re.M)
    return {parts[i]: f"({parts[i + 1]})\n{parts[i + 2]}" for i in range(1, len(parts), 3)}


HOOKS = _hookspecs()


def test_every_hookspec_is_found():
    """The introspection sees all seven hooks (so the checks below cannot pass vacuously)."""
    assert {name for name, _, _ in HOOKS} == {
        "opregistry_namespaces", "opregistry_ops", "opregistry_kernels", "opregistry_adoptions",
        "opregistry_backends", "opregistry_backend_available", "opregistry_materialize_kernel"}


def test_no_undocumented_or_stale_hooks():
    """docs/hooks.md has a section for each hook and none for a hook that does not exist."""
    assert set(_sections()) == {name for name, _, _ in HOOKS}


@pytest.mark.parametrize("name,args,firstresult", HOOKS, ids=[h[0] for h in HOOKS])
def test_hook_is_documented_with_arguments_and_semantics(name, args, firstresult):
    """Each hook's heading shows its exact signature; the body names each argument and its kind."""
    section = _sections()[name]
    signature, _, body = section.partition("\n")
    assert signature == f"({', '.join(args)})"
    for arg in args:
        assert f"`{arg}`" in body or f"`{arg}" in signature, f"{name}: argument {arg} undocumented"
    if args and name == "opregistry_materialize_kernel":
        # every argument gets its own bullet
        for arg in args:
            assert re.search(rf"^\* `{arg}`:", body, flags=re.M), arg
    first_words = body.strip().split(".")[0]
    if firstresult:
        assert first_words.startswith("firstresult"), f"{name} is firstresult: say so first"
        assert "stops at first non-None result" in body
    else:
        assert first_words.startswith("Collect-all"), f"{name} is collect-all: say so first"
