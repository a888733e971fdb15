"""Plot bench_scaling.py's JSON: seconds vs number of ops, log-log, with a linear guide.

    pip install -r benchmarks/requirements.txt   # matplotlib, for this script only
    python benchmarks/plot_scaling.py scaling.json docs/img/scaling.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(source: str, target: str) -> int:
    data = json.loads(Path(source).read_text())
    rows = data["rows"]
    ops = [r["ops"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, group, title in ((axes[0], "registration", "registration, in-process"),
                             (axes[1], "startup", "start-up, whole process")):
        for name in rows[0][group]:
            ax.plot(ops, [r[group][name] for r in rows], marker="o", label=name)
        first = rows[0][group]
        ref_name = "opregistry materialize" if group == "registration" else "opregistry list --json"
        ref = first[ref_name]
        ax.plot(ops, [ref * o / ops[0] for o in ops], linestyle=":", color="grey",
                label=f"linear in ops (from {ref_name})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ops (10 per distribution)")
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("opregistry scaling (CPU machine, shared by other jobs)")
    fig.tight_layout()
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
