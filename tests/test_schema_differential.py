"""Differential tests: opregistry judges a schema as ``torch.library.define`` does.

On the running torch (CI runs these on 2.8, 2.13 and 2.15): every schema torch
itself knows (``torch._C._jit_get_all_schemas()``) and every form of
tests/schema_forms.py is defined for real in a ``FRAGMENT`` library of a
unique namespace (then destroyed) and declared through ``OpLibrary`` and
resolved by opregistry's resolver (without torch's help for the schema: the
resolver has only the parser, its per-release tables and the torch state).
The two verdicts must agree, except for :data:`opregistry.schema.DELIBERATE_REFUSALS`,
each shown below to fail later in torch.  What opregistry accepts and prints
must read back in torch as the same schema, with the same arguments, defaults
and mutations.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import attrs
import pytest
import torch

from opregistry import DeclarationError, OpLibrary, SchemaError
from opregistry.discovery import OPS_GROUP
from opregistry.model import Declarations, Origin
from opregistry.resolver import resolve
from opregistry.schema import DELIBERATE_REFUSALS, Schema, parse_schema
from opregistry.torch_state import snapshot

from .schema_forms import FORMS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _without_namespace(schema: str) -> str:
    head, paren, rest = schema.partition("(")
    return head.rpartition("::")[2] + paren + rest


def _corpus() -> list[str]:
    """Every schema torch knows on this release, as it prints them, without namespace."""
    return [_without_namespace(str(s)) for s in torch._C._jit_get_all_schemas()]


def torch_verdicts(texts: list[str], prefix: str, tags: tuple[str, ...] = ()
                   ) -> list[str | None]:
    """``None`` where ``Library.define`` takes the text, else its error's first line."""
    verdicts: list[str | None] = []
    for i, text in enumerate(texts):
        ns = f"{prefix}{i}"
        lib = torch.library.Library(ns, "FRAGMENT")
        try:
            lib.define(text.replace("{ns}", ns), tags=tuple(getattr(torch.Tag, t) for t in tags))
            verdicts.append(None)
            # torch's Python side records "ns::ns::f" for a schema that names its namespace,
            # and then cannot destroy the library (opregistry never passes one to torch)
            lib._op_defs.difference_update([q for q in lib._op_defs if q.count("::") > 1])
        except Exception as exc:  # noqa: BLE001 - RuntimeError, ValueError, AttributeError
            verdicts.append(f"{type(exc).__name__}: {(str(exc).strip() or '?').splitlines()[0]}")
        finally:
            lib._destroy()
    return verdicts


def opregistry_verdicts(texts: list[str], prefix: str, tags: tuple[str, ...] = ()
                        ) -> list[str | None]:
    """``None`` where opregistry takes the text: declared with ``OpLibrary.define`` in a
    FRAGMENT of its own namespace and distribution, then resolved; else why not."""
    verdicts: list[str | None] = [None] * len(texts)
    namespaces, ops, origins = [], [], []
    for i, text in enumerate(texts):
        where = Origin(distribution=f"schema-diff-{i}", version="1.0", group=OPS_GROUP,
                       entry_point="ops", value=f"schema_diff_{i}:lib")
        lib = OpLibrary(f"{prefix}{i}", "FRAGMENT")
        try:
            lib.define(text.replace("{ns}", f"{prefix}{i}"), tags=tags)
        except DeclarationError as exc:
            verdicts[i] = f"declaration: {exc}"
            continue
        namespaces += [attrs.evolve(n, origin=where) for n in lib.opregistry_namespaces()]
        ops += [attrs.evolve(o, origin=where) for o in lib.opregistry_ops()]
        origins.append(where)
    plan = resolve(Declarations(namespaces=namespaces, ops=ops, distributions=origins),
                   torch_state=snapshot())
    for problem in plan.errors:
        for culprit in problem.culprits:
            i = int(culprit.distribution.rpartition("-")[2])
            verdicts[i] = verdicts[i] or f"[{problem.code}] {problem.message}"
    planned = {op.op.qualname for op in plan.ops}
    for i, op in zip((int(o.origin.distribution.rpartition("-")[2]) for o in ops), ops):
        assert verdicts[i] is not None or op.qualname in planned, (texts[i], "neither")
    return verdicts


def _deliberate(text: str, prefix: str) -> str | None:
    """The deliberate refusal that explains opregistry refusing ``text``, if one does."""
    try:
        parsed = parse_schema(text.replace("{ns}", prefix), deliberate=False)
    except SchemaError:
        return None
    refusal = parsed.deliberate_refusal()
    return refusal[0] if refusal else None


def differential(texts: list[str]) -> dict[str, object]:
    """Both verdicts on every text; the disagreements no deliberate refusal explains."""
    prefix = f"sd{uuid.uuid4().hex[:8]}_"
    theirs = torch_verdicts(texts, prefix)
    ours = opregistry_verdicts(texts, prefix)
    deliberate: dict[str, list[str]] = {}
    unexplained = []
    for text, t, o in zip(texts, theirs, ours):
        if (t is None) == (o is None):
            continue
        code = _deliberate(text, prefix) if t is None else None
        if code is not None:
            deliberate.setdefault(code, []).append(text)
        else:
            unexplained.append((text, t, o))
    result = {"schemas": len(texts), "torch accepts": sum(t is None for t in theirs),
              "opregistry accepts": sum(o is None for o in ours), "deliberate": deliberate,
              "unexplained": unexplained, "accepted": [x for x, o in zip(texts, ours) if o is None]}
    print(f"torch {torch.__version__}: {result['schemas']} schemas, torch accepts "
          f"{result['torch accepts']}, opregistry accepts {result['opregistry accepts']}, "
          f"deliberate refusals {sum(map(len, deliberate.values()))}, "
          f"disagreements {len(unexplained)}")
    return result


@pytest.fixture(scope="module")
def corpus_result() -> dict[str, object]:
    return differential(_corpus())


@pytest.fixture(scope="module")
def forms_result() -> dict[str, object]:
    return differential(list(FORMS))


def test_every_schema_torch_knows(corpus_result: dict[str, object]) -> None:
    """The ~4,400 schemas of torch's own ops: one verdict, torch's (less the deliberate ones)."""
    assert corpus_result["schemas"] > 4000 and corpus_result["torch accepts"] > 4000
    assert corpus_result["unexplained"] == [], "\n".join(map(repr, corpus_result["unexplained"]))
    # static_runtime::clamp_nan_to_num names 'posinf' twice: torch's own schemas have one
    assert set(corpus_result["deliberate"]) <= set(DELIBERATE_REFUSALS)


def test_every_form_people_write(forms_result: dict[str, object]) -> None:
    """~950 forms, accepted and refused, written and printed: one verdict, torch's."""
    assert forms_result["torch accepts"] > 400 and forms_result["schemas"] - forms_result[
        "torch accepts"] > 300, "the forms try both sides of every rule"
    assert forms_result["unexplained"] == [], "\n".join(map(repr, forms_result["unexplained"]))
    assert set(forms_result["deliberate"]) == set(DELIBERATE_REFUSALS), (
        "every deliberate refusal has a form that shows it")


def _qualified(text: str, ns: str) -> str:
    """For ``torch._C.parse_schema``, which takes a name with or without namespace; and up to a
    NUL character, as ``Library.define`` reads it (a C string), where ``parse_schema`` fails."""
    return text.replace("{ns}", ns).partition("\0")[0]


def _accepted(result: dict[str, object]) -> list[tuple[str, Schema]]:
    return [(text, parse_schema(text.replace("{ns}", "rt"))) for text in result["accepted"]]


def test_what_opregistry_prints_torch_reads_back_alike(corpus_result: dict[str, object],
                                                        forms_result: dict[str, object]) -> None:
    """Round trip: the schema opregistry prints parses in torch to the very schema the original
    text does (compared as torch prints both)."""
    checked = 0
    for text, ours in _accepted(corpus_result) + _accepted(forms_result):
        theirs = str(torch._C.parse_schema(_qualified(text, "rt")))
        again = str(torch._C.parse_schema(_qualified(str(ours), "rt")))
        assert again == theirs, (text, str(ours))
        checked += 1
    assert checked > 4500


def _alias(arg: object) -> tuple[bool, bool]:
    info = getattr(arg, "alias_info")
    return (info is not None, bool(info is not None and info.is_write))


def test_arguments_and_returns_as_torch_reads_them(corpus_result: dict[str, object],
                                                   forms_result: dict[str, object]) -> None:
    """Names, keyword-only, defaults, alias sets and writes, varargs: as torch's own parse."""
    for text, ours in _accepted(corpus_result) + _accepted(forms_result):
        theirs = torch._C.parse_schema(_qualified(text, "rt"))
        assert [a.name for a in ours.arguments] == [a.name for a in theirs.arguments], text
        assert [a.kwarg_only for a in ours.arguments] == [a.kwarg_only for a in theirs.arguments]
        assert [a.default is not None for a in ours.arguments] == [
            a.has_default_value() for a in theirs.arguments], text
        assert [(a.type.alias_info is not None, a.is_write) for a in ours.arguments] == [
            _alias(a) for a in theirs.arguments], text
        for mine, their in zip(ours.arguments, theirs.arguments):
            alias = mine.type.alias_info
            if alias is not None and alias.sets:
                assert set(alias.sets) == set(their.alias_info.before_set), text
        assert [r.name or "" for r in ours.returns] == [r.name for r in theirs.returns], text
        assert [(r.type.alias_info is not None) for r in ours.returns] == [
            r.alias_info is not None for r in theirs.returns], text
        assert [a.type.list_size for a in ours.arguments] == [a.N for a in theirs.arguments], text
        printed = str(theirs)  # the binding has no is_vararg / is_varret: torch prints them
        args, _, rets = printed.rpartition(") -> ")
        assert (ours.is_vararg, ours.is_varret) == (
            args.endswith("..."), rets == "..." or rets.endswith(", ...)")), text
        assert ours.is_mutable == theirs.is_mutable, text


TAGGED = (
    "f.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)",
    "f.out(Tensor x, *, Tensor! out) -> Tensor!",
    "f.out(Tensor x, *, Tensor! out) -> ()",
    "f.out(Tensor x, *, Tensor(a!) out, Tensor(b!) out2) -> (Tensor(a!), Tensor(b!))",
    "f.out(Tensor x, *, Tensor(a!) out, Tensor(b!) out2) -> (Tensor(b!), Tensor(a!))",
    "f.out(Tensor x, *, Tensor(a!) out) -> Tensor(a)",
    "f.out(Tensor x, *, Tensor(a|b!) out) -> Tensor(b|a!)",
    "f.out(Tensor x, *, Tensor(a!)[] out) -> Tensor(a!)[]",
    "f.out(Tensor x, *, Tensor(a!)? out) -> Tensor(a!)?",
    "f.out(Tensor x, Tensor(a!) out) -> Tensor(a!)",
    "f.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!) result",
    "f_(Tensor(a!) self, Tensor other) -> Tensor(a!)",
    "f_(Tensor! self, Tensor other) -> Tensor!",
    "f_(Tensor(a!) self, Tensor(b!) other) -> Tensor(a!)",
    "f_(Tensor(a!) self) -> (Tensor(a!), Tensor)",
    "f_(Tensor(a!) self) -> Tensor(a)",
    "f_(Tensor(a!)? self) -> Tensor(a!)?",
    "f_(*, Tensor(a!) self) -> Tensor(a!)",
    "f_(Tensor self) -> Tensor",
    "f_(Tensor(a|b!) self, *, Scalar alpha=1) -> Tensor(b|a!)",
    "f_(Tensor(a!) self, int[] dims, float eps=1e-05) -> Tensor(a!) self",
)


@pytest.mark.parametrize("tag", ["out", "inplace"])
def test_out_and_inplace_tags_as_torch_checks_them(tag: str) -> None:
    """The schema rules of the ``out`` and ``inplace`` tags, ``Tensor!`` included: one verdict.
    On a torch without the tag (2.8), torch cannot take it and opregistry says which release can."""
    prefix = f"sdt{uuid.uuid4().hex[:8]}_"
    texts = list(TAGGED)
    if hasattr(torch.Tag, tag):
        theirs = torch_verdicts(texts, prefix, (tag,))
    else:
        theirs = [f"torch {torch.__version__} has no torch.Tag.{tag}"] * len(texts)
    ours = opregistry_verdicts(texts, prefix, (tag,))
    assert sum(t is None for t in theirs) > 1 or not hasattr(torch.Tag, tag)
    wrong = [(x, t, o) for x, t, o in zip(texts, theirs, ours) if (t is None) != (o is None)]
    assert wrong == [], "\n".join(map(repr, wrong))


# -- what opregistry refuses on purpose, and where torch fails instead -------------------


def test_duplicate_argument_names_fail_later_in_torch(ns: str) -> None:
    """``Library.define`` takes two arguments named alike; ``opcheck`` and torch.fx's argument
    normalization then fail on the op, which is why opregistry refuses it up front."""
    from torch.fx.operator_schemas import normalize_function

    assert "duplicate-argument-name" in DELIBERATE_REFUSALS
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("pair(Tensor x, Tensor x) -> Tensor")  # torch: fine
        lib.impl("pair", lambda a, b: a + 2 * b, "CompositeExplicitAutograd")
        op = getattr(torch.ops, ns).pair.default
        x, y = torch.ones(2), torch.zeros(2)
        torch.testing.assert_close(op(x, y), x)  # a positional call works...
        with pytest.raises(Exception, match="duplicate parameter name"):
            torch.library.opcheck(op, (x, y), test_utils=("test_schema",))
        with pytest.raises(ValueError, match="duplicate parameter name"):
            normalize_function(op, (x, y), {}, normalize_to_only_use_kwargs=True)
    finally:
        lib._destroy()
    with pytest.raises(SchemaError, match="appears twice.*opcheck"):
        parse_schema("pair(Tensor x, Tensor x) -> Tensor")


def test_deliberate_refusals_are_documented() -> None:
    """docs/op-authors.md lists every deliberate refusal by its code, with the reason."""
    page = (DOCS / "op-authors.md").read_text(encoding="utf-8")
    section = page.split("## What opregistry refuses that torch accepts", 1)[1].split("\n## ")[0]
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", section, re.M))
    assert listed == set(DELIBERATE_REFUSALS)


def test_types_nested_deeper_than_python_recurses_are_a_schema_error() -> None:
    """Types nest by recursion: a pathological schema is a SchemaError, never a RecursionError."""
    for inner in ("(" * 5000 + "int" + ")" * 5000, "Future(" * 3000 + "int" + ")" * 3000):
        with pytest.raises(SchemaError, match="nested too deeply"):
            parse_schema(f"f({inner} x) -> ()")
    assert parse_schema("f(" + "(" * 20 + "int" + ")" * 20 + " x) -> ()").arguments[0].name == "x"
