"""The documentation: the site builds without warnings, and its code blocks run.

Code blocks in the pages of :data:`RUN_PAGES` are executed in order, one
fresh working directory and one throw-away virtualenv per page, as a reader
would type them:

* a fenced ``python`` block runs as a script with the virtualenv's python;
* a fenced ``bash`` block runs with ``bash -e`` (``pip``, ``python`` and
  ``opregistry`` are the virtualenv's);
* ``<!-- file: PATH -->`` before a block writes the block to ``PATH``
  instead of running it (a package the page builds);
* ``<!-- expect -->`` before a ``text`` block: every line of it must appear
  in the output of the block run just before;
* ``<!-- excerpt: PATH -->`` before a block: the block is a verbatim excerpt
  of the repository file ``PATH`` (an example package's source), checked,
  not run — so quoted code cannot drift from the code that is tested;
* ``<!-- package: DIST VERSION EP = MODULE:ATTR -->`` before a ``python``
  block makes it the module of a distribution ``DIST`` with that entry point
  in ``opregistry.ops`` (a ``*.dist-info`` on ``PYTHONPATH``); the packages
  declared since the previous run block are visible to the next run block
  only, so each example on a page sees its own packages;
* in an ``expect`` block, ``...`` stands for any text within a line;
* ``<!-- not run: REASON -->`` before a ``python``/``bash`` block skips it;
  the reason is required.

The throw-away virtualenv sees the development environment's packages
(torch, opregistry and its backends) through a ``.pth`` file, so that
``pip install -e ./mypackage`` in a page really installs, with real entry
points, into a place the test deletes afterwards — and never touches .venv.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from . import per_version

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: pages whose blocks this file runs (other pages are tested by their owners'
#: tests: backend-authors/hooks in test_backends.py, cli.md in test_cli.py, ...)
RUN_PAGES = ["index.md", "getting-started.md", "op-authors.md", "resolution.md", "migrating.md",
             "ecosystem.md", "reliability.md", "../README.md"]
#: pages written with features of a torch newer than the floor of the range, and that torch:
#: on an older one they are not run (the features' own per-release tests run there)
PAGE_NEEDS = {"op-authors.md": ((2, 13), "the inplace and out tags (torch.Tag.inplace, .out)")}

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<kind>file|expect|excerpt|package|not run)\s*:?\s*(?P<arg>.*?)\s*-->\s*$")


@attrs.frozen
class Block:
    page: str
    line: int
    lang: str
    code: str
    directive: str | None = None
    arg: str = ""

    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page``, each with the directive comment just before it."""
    lines = (DOCS / page).read_text().splitlines()
    found: list[Block] = []
    directive: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        d = _DIRECTIVE.match(line)
        if d:
            directive = (d["kind"], d["arg"])
            i += 1
            continue
        m = _FENCE.match(line)
        if m:
            start, fence, indent = i, m["fence"], len(m["indent"])
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != fence:
                body.append(lines[i][indent:])
                i += 1
            kind, arg = directive or (None, "")
            found.append(Block(page, start + 1, m["info"].strip().split(" ")[0], "\n".join(body)
                               + "\n", kind, arg))
            directive = None
        elif line.strip():
            directive = None
        i += 1
    return found


class Reader:
    """A fresh directory and virtualenv in which a page's blocks are typed."""

    def __init__(self, root: Path) -> None:
        self.cwd = root / "work"
        self.cwd.mkdir(parents=True)
        self.venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)
        bin_dir = self.venv / "bin"
        python = bin_dir / "python"
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path"
                                  "('purelib'))"], capture_output=True, text=True, check=True)
        dev_site = [p for p in site.getsitepackages() if p.endswith("site-packages")][0]
        Path(purelib.stdout.strip(), "_dev_env.pth").write_text(
            f"import site; site.addsitedir({dev_site!r})\n")
        # console scripts that run with *this* interpreter, as pip would install them
        for name, target in (("pip", "pip._internal.cli.main"), ("opregistry", "opregistry.cli")):
            script = bin_dir / name
            script.write_text(f"#!{python}\nimport sys\nfrom {target} import main\n"
                              f"sys.exit(main())\n")
            script.chmod(0o755)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("OPREGISTRY_", "PYTHON", "PIP_", "VIRTUAL_ENV"))}
        self.env.update(
            PATH=f"{bin_dir}{os.pathsep}{self.env.get('PATH', '')}",
            VIRTUAL_ENV=str(self.venv),
            PIP_NO_BUILD_ISOLATION="0",  # (sic) pip reads this as --no-build-isolation
            PIP_NO_INDEX="1",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
        )
        if per_version.REFUSED_DISTRIBUTIONS:
            # nnkit needs a newer torch than this one (tests/per_version.py): the pages,
            # written for the pinned torch, run without it; pages that use it are skipped
            self.env["OPREGISTRY_BLOCK"] = ",".join(sorted(per_version.REFUSED_DISTRIBUTIONS))
        self.last_output = ""
        self.packages: list[Path] = []

    def package(self, block: Block) -> None:
        """A distribution whose entry point names the block's module (real entry point)."""
        m = re.fullmatch(r"(?P<dist>\S+) (?P<version>\S+) (?P<ep>\S+) = (?P<module>[\w.]+):"
                         r"(?P<attr>\w+)", block.arg)
        assert m, f"{block.where()}: write <!-- package: DIST VERSION EP = MODULE:ATTR -->"
        root = self.cwd.parent / f"site_{block.line}"
        info = root / f"{m['dist'].replace('-', '_')}-{m['version']}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {m['dist']}\nVersion: {m['version']}\n")
        (info / "entry_points.txt").write_text(
            f"[opregistry.ops]\n{m['ep']} = {m['module']}:{m['attr']}\n")
        module = root / (m["module"].replace(".", "/") + ".py")
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(block.code)
        self.packages.append(root)

    def run(self, block: Block) -> None:
        if block.lang == "python":
            script = self.cwd / f"_block_{block.line}.py"
            script.write_text(block.code)
            cmd = [str(self.venv / "bin" / "python"), script.name]
        else:
            cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
        env = dict(self.env)
        if self.packages:
            env["PYTHONPATH"] = os.pathsep.join(map(str, self.packages))
            self.packages = []
        proc = subprocess.run(cmd, cwd=self.cwd, env=env, capture_output=True, text=True,
                              timeout=300)
        self.last_output = proc.stdout + proc.stderr
        assert proc.returncode == 0, (
            f"{block.where()}: the {block.lang} block failed (exit {proc.returncode})\n"
            f"--- block ---\n{block.code}--- output ---\n{self.last_output}")

    def expect(self, block: Block) -> None:
        produced = [" ".join(line.split()) for line in self.last_output.splitlines()]
        for line in block.code.splitlines():
            wanted = " ".join(line.split())
            pattern = re.compile(".*".join(re.escape(part) for part in wanted.split("...")))
            if wanted and not any(pattern.search(p) for p in produced):
                raise AssertionError(
                    f"{block.where()}: expected output line not produced: {line!r}\n"
                    f"--- actual output ---\n{self.last_output}")


def run_page(page: str, tmp_path: Path) -> int:
    reader = Reader(tmp_path)
    executed = 0
    for block in blocks(page):
        if block.directive == "file":
            assert block.arg, f"{block.where()}: <!-- file: PATH --> needs a path"
            target = reader.cwd / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
        elif block.directive == "expect":
            reader.expect(block)
        elif block.directive == "package":
            reader.package(block)
        elif block.directive == "excerpt":
            source = ROOT / block.arg
            assert source.is_file(), f"{block.where()}: excerpt of missing file {block.arg}"
            assert block.code.strip() in source.read_text(), (
                f"{block.where()}: this block is no longer an excerpt of {block.arg}; "
                f"copy the current code into the page\n--- block ---\n{block.code}")
        elif block.directive == "not run":
            assert block.arg, f"{block.where()}: <!-- not run: REASON --> needs a reason"
        elif block.lang in ("python", "bash"):
            reader.run(block)
            executed += 1
    return executed


@pytest.mark.parametrize("page", RUN_PAGES)
def test_code_blocks_run(page: str, tmp_path: Path) -> None:
    """Every python/bash block of the page runs, in order, as a reader would run it."""
    needs = PAGE_NEEDS.get(page)
    if needs is not None and per_version.release() < needs[0]:
        pytest.skip(f"{page} uses {needs[1]}, from torch {'%d.%d' % needs[0]}; this is "
                    f"torch {per_version.TORCH}")
    runs = [b for b in blocks(page) if b.lang in ("python", "bash") and b.directive is None]
    if per_version.NNKIT_REFUSED and any("nnkit" in b.code for b in runs):
        import opregistry

        per_version.need_nnkit(opregistry.plan().problems)
    run_page(page, tmp_path)


def test_runner_catches_a_failing_block_and_a_wrong_output(tmp_path: Path, monkeypatch) -> None:
    """The harness itself can fail: a raising block, and an output the page promised but lacks."""
    docs = tmp_path / "docs"
    docs.mkdir()
    monkeypatch.setattr(sys.modules[__name__], "DOCS", docs)
    (docs / "bad.md").write_text(textwrap.dedent("""\
        ```python
        raise SystemExit("boom")
        ```
    """))
    with pytest.raises(AssertionError, match="docs/bad.md:1: the python block failed"):
        run_page("bad.md", tmp_path / "a")
    (docs / "wrong.md").write_text(textwrap.dedent("""\
        <!-- file: hello.py -->
        ```python
        print("hello")
        ```

        ```bash
        python hello.py
        ```

        <!-- expect -->
        ```text
        goodbye
        ```
    """))
    with pytest.raises(AssertionError, match="expected output line not produced: 'goodbye'"):
        run_page("wrong.md", tmp_path / "b")
    (docs / "drift.md").write_text(textwrap.dedent("""\
        <!-- excerpt: examples/nnkit/nnkit/registry.py -->
        ```python
        lib = OpLibrary("nnkit", description="something else")
        ```
    """))
    with pytest.raises(AssertionError, match="no longer an excerpt of examples/nnkit"):
        run_page("drift.md", tmp_path / "c")


def test_every_run_page_has_blocks_and_no_stray_directive() -> None:
    """Directives attach to a block; file and expect blocks have what they need."""
    for page in RUN_PAGES:
        found = blocks(page)
        assert found, f"docs/{page} has no code block"
        text = (DOCS / page).read_text()
        directives = sum(text.count(f"<!-- {d}") for d in ("file", "expect", "excerpt", "package", "not run"))
        assert directives == sum(b.directive is not None for b in found), page


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds: no broken link, anchor or nav entry, no warning."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs, "mkdocs is not installed: pip install -r requirements-dev.txt"
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    for page in RUN_PAGES[:-1]:  # README.md is the repository's front page, not the site's
        html = tmp_path / "site" / ("index.html" if page == "index.md"
                                    else page.removesuffix(".md") + "/index.html")
        assert html.exists(), f"{page} is not in the built site"


def test_mkdocs_strict_fails_on_a_broken_link(tmp_path: Path) -> None:
    """The build is a real check: a link to a missing page fails it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\nSee [missing](nowhere.md).\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = re.sub(r"(?ms)^nav:.*?(?=^\S|\Z)", "", config)
    (tmp_path / "mkdocs.yml").write_text(config)
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "nowhere.md" in proc.stderr
