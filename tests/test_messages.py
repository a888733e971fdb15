"""Problem text is bounded: long schemas and names are elided in text, whole in data."""

from __future__ import annotations

import pytest

from opregistry import ResolutionError
from opregistry.model import TEXT_LIMIT, Problem, elide


@pytest.mark.parametrize("length", [0, 1, TEXT_LIMIT, TEXT_LIMIT + 1, TEXT_LIMIT + 50, 10_000,
                                    1_000_000])
def test_elide_keeps_short_text_and_bounds_long_text(length):
    text = "".join(chr(ord("a") + i % 26) for i in range(length))
    out = elide(text)
    if length <= TEXT_LIMIT:
        assert out == text
    else:
        assert len(out) <= TEXT_LIMIT
        head, _, tail = out.partition(" ...[")
        assert text.startswith(head) and text.endswith(tail.split("]... ", 1)[1])
        elided = int(tail.split(" characters", 1)[0].replace(",", ""))
        assert len(head) + elided + len(tail.split("]... ", 1)[1]) == length


def test_elide_without_limit_and_with_a_small_one():
    assert elide("x" * 5000, None) == "x" * 5000
    assert "characters elided" in elide("x" * 5000, 100) and len(elide("x" * 5000, 100)) <= 100


def test_problem_text_is_bounded_and_its_data_whole():
    schema = "f(" + ", ".join(f"Tensor a{i}" for i in range(10_000)) + ") -> Tensor"
    problem = Problem(code="schema-invalid", message=f"bad==1.0: schema {schema!r} is invalid",
                      hint=f"fix {schema}", source="/x/bad.py:3")
    text = str(problem)
    assert text == problem.text()
    assert len(text) < 3 * TEXT_LIMIT
    assert text.startswith("[schema-invalid] bad==1.0: schema") and "(at /x/bad.py:3)" in text
    assert problem.to_dict()["message"] == problem.message and len(problem.message) > 100_000
    assert problem.text(limit=None) == (f"[schema-invalid] {problem.message} (at /x/bad.py:3) "
                                        f"-> {problem.hint}")
    error = ResolutionError([problem] * 3)
    assert len(str(error)) < 10 * TEXT_LIMIT
    assert error.problems[0].message == problem.message
