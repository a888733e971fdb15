"""``opregistry help TOPIC``: sections of the documentation, shipped inside the package.

A wheel user has no docs/ directory, so the topics travel as files,
``opregistry/help/<topic>.md``.  They are *generated* from docs/: a section
of a page between ``<!-- help: TOPIC -->`` and ``<!-- /help -->`` is the
topic, verbatim.  ``python -m opregistry.helptopics`` (from the repository
root) rewrites the files after the docs changed; a test fails while they
differ, so the two cannot drift.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

__all__ = ["names", "text", "summary", "page", "extract", "PAGES"]

#: The documentation pages topics are taken from.
PAGES = ("cli.md",)

_SECTION = re.compile(r"^<!-- help: (?P<topic>[\w-]+) -->\n(?P<text>.*?)^<!-- /help -->$",
                      re.S | re.M)
_PAGE_LINE = re.compile(r"^<!-- page: (?P<page>\S+) -->\n")


def _dir() -> Path:
    return Path(str(resources.files("opregistry") / "help"))


def names() -> list[str]:
    """Every topic, sorted."""
    return sorted(p.stem for p in _dir().glob("*.md"))


def _raw(topic: str) -> str:
    return (_dir() / f"{topic}.md").read_text(encoding="utf-8")


def text(topic: str) -> str:
    """The topic as markdown (without the line naming its page)."""
    return _PAGE_LINE.sub("", _raw(topic), count=1)


def page(topic: str) -> str:
    """The documentation URL of the topic, relative to the site: ``cli/#anchor``."""
    m = _PAGE_LINE.match(_raw(topic))
    return m["page"] if m else ""


def summary(topic: str) -> str:
    """The topic's heading; for a command's section, with what the command does."""
    lines = text(topic).splitlines()
    heading = next((ln.lstrip("#").strip().strip("`") for ln in lines if ln.startswith("#")), "")
    if " " in heading:
        return heading
    body = " ".join(ln for ln in lines if ln and not ln.startswith(("#", "<!--")))
    first = body.split(". ")[0].replace("`", "")
    return first if len(first) <= 70 else first[:67].rsplit(" ", 1)[0] + "..."


def _anchor(heading: str) -> str:
    """The anchor mkdocs' toc extension gives a heading."""
    slug = re.sub(r"[^\w\s-]", "", heading.lower()).strip()
    return re.sub(r"[\s-]+", "-", slug)


def extract(markdown: str, page_name: str) -> dict[str, str]:
    """Topic -> file content for every marked section of one page."""
    topics = {}
    for m in _SECTION.finditer(markdown):
        body = m["text"]
        heading = next((ln.lstrip("#").strip() for ln in body.splitlines()
                        if ln.startswith("#")), "")
        url = page_name.removesuffix(".md") + "/" + (f"#{_anchor(heading)}" if heading else "")
        topics[m["topic"]] = f"<!-- page: {url} -->\n{body}"
    return topics


def generate(docs: Path) -> dict[str, str]:
    """Every topic of :data:`PAGES` under ``docs``."""
    topics: dict[str, str] = {}
    for name in PAGES:
        topics.update(extract((docs / name).read_text(encoding="utf-8"), name))
    return topics


if __name__ == "__main__":  # pragma: no cover  (a maintainer's command, from the repo root)
    target = Path(__file__).parent / "help"
    fresh = generate(Path("docs"))
    for stale in target.glob("*.md"):
        if stale.stem not in fresh:
            stale.unlink()
    for topic, content in fresh.items():
        (target / f"{topic}.md").write_text(content, encoding="utf-8")
    print(f"wrote {len(fresh)} topic(s) to {target}")
