"""One registry across processes: every rank of a ``torch.distributed`` job resolves the same.

A rank that resolved another registry (an op package missing on one node,
another version, a backend blocked by an environment variable) computes
other results or hangs in a collective much later, far from the cause.
:func:`verify_consistent` finds it at start-up::

    torch.distributed.init_process_group("nccl")
    opregistry.distributed.verify_consistent()

Every rank gathers every rank's fingerprint (:mod:`opregistry.lockfile`: the
torch version, the distributions and everything they declare);
when they differ, the lock data is gathered too and every rank raises the
same :class:`~opregistry.LockMismatchError`, saying which ranks differ from
rank 0 and how.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import LockMismatchError
from .lockfile import diff_lock, fingerprint_of, lock_data
from .registry import current_plan

if TYPE_CHECKING:
    from .plans import Plan

__all__ = ["verify_consistent"]


def verify_consistent(group: Any = None, *, plan: Plan | None = None) -> str:
    """Check that every rank of ``group`` resolved the same registry; return its fingerprint.

    A collective: every rank of ``group`` (default: the world) must call it.
    ``plan`` defaults to the plan of the loaded registry, or to
    :func:`opregistry.plan` when nothing is loaded.  Works with any backend
    that supports ``all_gather_object`` (gloo, nccl -- with nccl the current
    CUDA device must be set, as for every object collective).

    :raises LockMismatchError: on every rank, when any rank differs, listing
        each group of differing ranks and every difference from rank 0.
    :raises RuntimeError: when ``torch.distributed`` is not initialized.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "opregistry.distributed.verify_consistent() needs an initialized process group: "
            "call torch.distributed.init_process_group(...) first"
        )
    data = lock_data(plan if plan is not None else current_plan())
    mine = fingerprint_of(data)
    size = dist.get_world_size(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))

    # Fingerprints first: on the healthy path only 71 bytes per rank travel.
    prints: list[Any] = [None] * size
    dist.all_gather_object(prints, mine, group=group)
    if len(set(prints)) == 1:
        return mine
    # Every rank saw the same fingerprints, so every rank takes this branch.
    everything: list[Any] = [None] * size
    dist.all_gather_object(everything, data, group=group)

    def label(members: list[int]) -> str:
        names = ", ".join(str(ranks[i]) for i in members)
        return f"rank {names}" if len(members) == 1 else f"ranks {names}"

    reference = everything[0]
    by_print: dict[str, list[int]] = {}
    for index, fp in enumerate(prints):
        by_print.setdefault(fp, []).append(index)
    lines = [f"the ranks resolved {len(by_print)} different registries:"]
    lines += [f"  {label(members)}: {fp}" for fp, members in by_print.items()]
    differences: list[str] = []
    for fp, members in by_print.items():
        if fp == prints[0]:
            continue
        found = diff_lock(reference, everything[members[0]], old_label=f"rank {ranks[0]}",
                          new_label=label(members))
        verb = "differs" if len(members) == 1 else "differ"
        lines.append(f"{label(members)} {verb} from rank {ranks[0]}:")
        lines += [f"  - {d}" for d in found]
        differences += found
    lines.append("Install the same torch and the same distributions (and versions) on every "
                 "node, with the same OPREGISTRY_PLUGINS / OPREGISTRY_BLOCK / "
                 "OPREGISTRY_ALLOW_OVERRIDE; 'opregistry lock' on one node and "
                 "'opregistry verify' on the others shows the same differences.")
    raise LockMismatchError("\n".join(lines), differences=differences)
