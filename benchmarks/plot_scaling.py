"""Plot bench_scaling.py's JSON: seconds vs number of ops, log-log, with a linear guide.

    pip install -r benchmarks/requirements.txt   # matplotlib, for this script only
    python benchmarks/plot_scaling.py scaling.json docs/img/scaling.png [--before old.json]

With ``--before``, a second row compares this run with an earlier one (same
JSON shape; series it lacks are skipped), dashed in the same colours: as
ratios to each run's own baseline (raw ``torch.library`` calls, bare
``import torch``), because seconds measured on a machine under different
load are not comparable.  ``docs/img/scaling-before.json`` holds the
first session's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


#: per panel, the series every other one is divided by in the relative row: the
#: raw torch.library calls for registration, a bare ``import torch`` for start-up
BASELINES = {"registration": "torch.library", "startup": "import torch (bare)"}


def relative(rows: list[dict[str, Any]], group: str) -> dict[str, list[float]]:
    """Each series of ``group`` divided by the run's own baseline, size by size."""
    base = BASELINES[group]
    return {name: [r[group][name] / r[group][base] for r in rows]
            for name in rows[0][group] if name != base}


def main(source: str, target: str, before: str | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(source).read_text())
    rows = data["rows"]
    ops = [r["ops"] for r in rows]
    old = json.loads(Path(before).read_text())["rows"] if before else []
    fig, axes = plt.subplots(2 if old else 1, 2, figsize=(11, 8.4 if old else 4.2),
                             squeeze=False)
    for col, (group, title) in enumerate((("registration", "registration, in-process"),
                                          ("startup", "start-up, whole process"))):
        ax = axes[0][col]
        for name in rows[0][group]:
            ax.plot(ops, [r[group][name] for r in rows], marker="o", label=name)
        first = rows[0][group]
        ref_name = "opregistry materialize" if group == "registration" else "opregistry list --json"
        ref = first[ref_name]
        ax.plot(ops, [ref * o / ops[0] for o in ops], linestyle=":", color="grey",
                label=f"linear in ops (from {ref_name})")
        _axes(ax, title, "seconds")
        if old:
            # seconds from two runs on a machine whose load differed are not comparable;
            # each run's ratio to its own baseline, measured beside it, is
            base = BASELINES[group]
            ax = axes[1][col]
            then = relative(old, group)
            for name, now in relative(rows, group).items():
                if name not in then:
                    continue
                (line,) = ax.plot(ops, now, marker="o", label=name)
                ax.plot([r["ops"] for r in old], then[name], marker="x", linestyle="--",
                        color=line.get_color(), alpha=0.6, label=f"{name} (before)")
            _axes(ax, f"{group}: ÷ {base} of the same run", f"÷ {base}")
    fig.suptitle("opregistry scaling (CPU machine, shared by other jobs)")
    fig.tight_layout()
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    print(f"wrote {target}")
    return 0


def _axes(ax: Any, title: str, ylabel: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ops (10 per distribution)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="bench_scaling.py --json output")
    parser.add_argument("target", help="the image to write (.png)")
    parser.add_argument("--before", help="an earlier run's JSON, drawn dashed beside it")
    opts = parser.parse_args()
    sys.exit(main(opts.source, opts.target, opts.before))
