"""docs/troubleshooting.md quotes real messages: each one is reproduced here.

Every ``<!-- message: NAME -->`` text block of the page is matched against the
output of the scenario :data:`SCENARIOS` names: each line of the block (``...``
standing for any text within a line, whitespace normalised) must appear in
the output of really triggering that error, with throw-away op packages (a
``*.dist-info`` with a real entry point on ``PYTHONPATH``) beside the
installed example packages.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
_MESSAGE = re.compile(r"<!--\s*message:\s*(?P<name>[\w-]+)\s*-->\s*\n```text\n(?P<body>.*?)\n```",
                      re.S)

#: throw-away op packages: distribution -> (entry point, module source); their
#: kernel modules are written beside them
PACKAGES = {
    "otherops": ("otherops_reg", """\
        from opregistry import OpLibrary
        lib = OpLibrary("tutorial")
        lib.define("muladd(Tensor a, Tensor b, float c) -> Tensor", kernels={"cpu": "ts_kernels:twice"})
    """),
    "fastmuladd": ("fastmuladd_reg", """\
        from opregistry import OpLibrary
        lib = OpLibrary("tutorial", "IMPL")
        lib.impl("tutorial::muladd", "cpu", "ts_kernels:muladd")
    """),
    "cudaonly": ("cudaonly_reg", """\
        from opregistry import OpLibrary
        lib = OpLibrary("cudaonly")
        lib.define("scale(Tensor x) -> Tensor", kernels={"cuda": "ts_kernels:twice"},
                   fake="ts_kernels:twice_fake")
        lib.define("twice(Tensor x) -> Tensor", kernels={"cpu": "ts_kernels:twice"})
    """),
}
KERNELS = """\
    import torch
    def twice(x): return x * 2
    def twice_fake(x): return torch.empty_like(x)
    def muladd(a, b, c): return a * b + c
"""

CALL_MULADD = "import torch\nx = torch.randn(3)\nprint(torch.ops.tutorial.muladd(x, x, 1.0))\n"

#: message name -> [(packages, environment, command), ...]; the outputs are concatenated.
#: A command is ("list", args) for the opregistry CLI or ("python", code).
SCENARIOS: dict[str, list[tuple[tuple[str, ...], dict[str, str], tuple[str, str]]]] = {
    "namespace-conflict": [(("otherops",), {}, ("list", "-n tutorial"))],
    "kernel-conflict": [(("fastmuladd",), {}, ("list", "-n tutorial"))],
    "torch-library-def": [((), {}, ("python", "import torch\n"
                                    "torch.library.Library('tutorial', 'DEF')\n"))],
    "torch-library-def-first": [((), {"OPREGISTRY_AUTOLOAD": "0"}, ("python", (
        "import torch, opregistry\n"
        "keep = torch.library.Library('tutorial', 'DEF')\n"
        "for problem in opregistry.load().problems:\n    print(problem)\n"
        "assert not hasattr(torch.ops.tutorial, 'muladd')\n")))],
    "op-missing": [((), {}, ("python", "import torch\ntorch.ops.myops.softcap\n"))],
    "no-kernel": [(("cudaonly",), {}, ("python", "import torch\n"
                                       "torch.ops.cudaonly.scale(torch.randn(3))\n"))],
    "no-active-kernel": [(("cudaonly",), {}, ("list", "-n cudaonly"))],
    "no-fake-compile": [(("cudaonly",), {}, ("python", (
        "import torch\n"
        "f = torch.compile(lambda t: torch.ops.cudaonly.twice(t), fullgraph=True)\n"
        "f(torch.randn(3))\n")))],
    "no-fake-meta": [(("cudaonly",), {}, ("python", "import torch\n"
                                          "torch.ops.cudaonly.twice(torch.randn(3, device='meta'))\n"))],
    "no-fake-list": [(("cudaonly",), {}, ("list", "-n cudaonly"))],
    # both switches, each on its own, give the same error
    "autoload-off": [((), {"OPREGISTRY_AUTOLOAD": "0"}, ("python", CALL_MULADD)),
                     ((), {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, ("python", CALL_MULADD))],
}


def page_messages() -> dict[str, str]:
    found = {m["name"]: m["body"] for m in _MESSAGE.finditer(PAGE.read_text())}
    assert len(found) == PAGE.read_text().count("<!-- message:"), "a message directive without a text block"
    return found


def missing_lines(expected: str, output: str) -> list[str]:
    """The lines of ``expected`` (``...``: any text) that appear in no line of ``output``."""
    produced = [" ".join(line.split()) for line in output.splitlines()]
    missing = []
    for line in expected.splitlines():
        wanted = " ".join(line.split())
        pattern = re.compile(".*".join(re.escape(part) for part in wanted.split("...")))
        if wanted and not any(pattern.search(p) for p in produced):
            missing.append(line)
    return missing


@pytest.fixture(scope="module")
def site_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One directory per throw-away package, each with a real entry point."""
    root = tmp_path_factory.mktemp("troubleshooting")
    (root / "kernels").mkdir()
    (root / "kernels" / "ts_kernels.py").write_text(textwrap.dedent(KERNELS))
    dirs = {"kernels": root / "kernels"}
    for dist, (module, source) in PACKAGES.items():
        site = root / dist
        info = site / f"{dist}-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text(f"[opregistry.ops]\n{dist} = {module}:lib\n")
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        dirs[dist] = site
    return dirs


def run_scenario(name: str, dirs: dict[str, Path], cwd: Path) -> str:
    output = []
    for packages, extra_env, (kind, arg) in SCENARIOS[name]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OPREGISTRY_", "TORCH_DEVICE_BACKEND")) and k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.pathsep.join(str(dirs[p]) for p in ("kernels", *packages))
        env.update(extra_env)
        if kind == "list":
            cli = shutil.which("opregistry", path=str(Path(sys.executable).parent))
            assert cli, "the opregistry console script is not installed"
            cmd = [cli, "list", *arg.split()]
        else:
            cmd = [sys.executable, "-c", arg]
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        output.append(proc.stdout + proc.stderr)
    return "\n".join(output)


def test_every_message_has_a_scenario() -> None:
    assert sorted(page_messages()) == sorted(SCENARIOS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_message_is_what_is_printed(name: str, site_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Trigger the error for real; the page's message must be in what was printed."""
    output = run_scenario(name, site_dirs, tmp_path)
    missing = missing_lines(page_messages()[name], output)
    assert not missing, (f"docs/troubleshooting.md, message {name!r}: not printed any more: "
                         f"{missing}\n--- actual output ---\n{output[-6000:]}")


@pytest.mark.slow
def test_the_autoload_fix_works(tmp_path: Path) -> None:
    """The fix the page gives for disabled autoload: opregistry.load() after import torch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env["OPREGISTRY_AUTOLOAD"] = "0"
    fix = re.search(r"<!-- not run: illustrates the fix[^>]*-->\n```python\n(.*?)```", PAGE.read_text(),
                    re.S)
    assert fix, "the page no longer shows the fix for disabled autoload"
    code = fix[1] + CALL_MULADD
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_matching_can_fail() -> None:
    """A message the page promises but the output lacks is reported."""
    out = "AttributeError: '_OpNamespace' 'myops' object has no attribute 'softcap'\n"
    assert missing_lines("AttributeError: '_OpNamespace' 'myops' ... 'softcap'", out) == []
    assert missing_lines("AttributeError: no such op 'softcap'", out) == [
        "AttributeError: no such op 'softcap'"]
