"""The problem-code table: every code the core reports is in it, and docs/problems.md is it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from opregistry.model import Problem
from opregistry.problems import CODES

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "problems.md"


#: functions returning ``(reason, why)`` pairs that are no problem code (the reason is part
#: of a ``schema-invalid`` message)
NOT_CODES = {"deliberate_refusal", "_status_in", "attribute_status"}


def _literal_codes(tree: ast.AST) -> list[tuple[int, str]]:
    """Codes written as literals where problems are made: ``code=``, ``refuse``/``warn``'s
    first argument, ``code, hint = "...", ...`` and a refusal's ``return ("code", why)``."""
    skipped = {id(n) for f in ast.walk(tree)
               if isinstance(f, ast.FunctionDef) and f.name in NOT_CODES for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                    found.append((node.lineno, kw.value.value))
            if (isinstance(node.func, ast.Attribute) and node.func.attr in ("refuse", "warn")
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found.append((node.lineno, node.args[0].value))
        elif (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
              and [getattr(e, "id", None) for e in node.targets[0].elts][:1] == ["code"]
              and isinstance(node.value, ast.Tuple) and isinstance(node.value.elts[0], ast.Constant)):
            found.append((node.lineno, node.value.elts[0].value))
        elif (isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple)
              and len(node.value.elts) == 2 and isinstance(node.value.elts[0], ast.Constant)
              and isinstance(node.value.elts[0].value, str)
              and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", node.value.elts[0].value)):
            found.append((node.lineno, node.value.elts[0].value))
    return found


def test_every_code_the_core_reports_is_in_the_table():
    unknown = [f"{path.relative_to(ROOT)}:{line}: {code}"
               for path in sorted((ROOT / "opregistry").rglob("*.py"))
               for line, code in _literal_codes(ast.parse(path.read_text()))
               if code not in CODES]
    assert not unknown, "\n".join(unknown)


def test_the_scan_of_codes_bites():
    tree = ast.parse("ctx.refuse('no-such-code', 'm', 'h', ())\nProblem(code='other-code')\n"
                     "code, hint = 'third-code', 'x'\ndef f():\n    return ('fourth-code', 'why')\n")
    assert sorted(c for _, c in _literal_codes(tree)) == [
        "fourth-code", "no-such-code", "other-code", "third-code"]


def _sections() -> dict[str, str]:
    text = PAGE.read_text()
    parts = re.split(r"^### `([a-z0-9-]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_page_is_the_table():
    sections = _sections()
    assert list(sections) == list(CODES), "docs/problems.md lists the codes of CODES, in order"
    for name, code in CODES.items():
        first = sections[name].strip().splitlines()[0]
        severities = " or ".join(f"**{s}**" for s in code.severities)
        leaves = ("leaves the distributions it names out" if code.leaves_out
                  else "leaves no distribution out")
        assert first.startswith(f"{severities}; {leaves}."), (name, first)


def test_a_problem_links_its_section_and_takes_the_codes_severity():
    p = Problem(code="kernel-conflict", message="m")
    assert (p.severity, p.leaves_out) == ("error", True)
    assert p.docs.endswith("problems/#kernel-conflict") and p.to_dict()["docs"] == p.docs
    assert Problem(code="op-no-vmap", message="m").severity == "info"
    assert not Problem(code="kernel-switch-unknown", message="m").leaves_out
    with pytest.raises(ValueError, match="'op-no-vmap' is never a 'error'"):
        Problem(code="op-no-vmap", message="m", severity="error")
    own = Problem(code="tally-on-mutable-op", message="m")  # a kind's own code
    assert (own.severity, own.leaves_out) == ("error", True) and own.docs.endswith("problems/")
