"""What every rule module reads and writes during one pass: :class:`Context`.

A pass runs the rule modules in order (backends, namespaces, ops, kernels,
then gaps once at the end) over the declarations of the distributions still
in.  Each rule reads the context's filtered declarations, the
:class:`~opregistry.environment.Environment` (torch's facts, installed
versions, the dispatcher when torch is imported) and the policy, and appends
:class:`~opregistry.model.Problem` records to it.  Nothing here reads the
machine: the environment was read before the resolver ran.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..config import Policy
from ..environment import Environment
from ..keys import RESERVED_NAMESPACES, TorchFacts
from ..model import Backend, Declarations, Kernel, Namespace, OpDef, Origin, Problem
from .foreign import ForeignOwners, foreign_owners

__all__ = ["Context", "dist_name", "names"]


def dist_name(origin: Origin | None) -> str:
    """The distribution's canonical name; ``<unknown>`` for a record without origin."""
    return origin.distribution if origin is not None else "<unknown>"


def names(origins: Iterable[Origin | None]) -> str:
    """``a==1.0 (entry point ...) and b==2.0 (...)``: every origin named once, sorted."""
    return " and ".join(sorted({str(o) for o in origins if o is not None}))


class Context:
    """One pass of the rules over the declarations of the distributions still in."""

    def __init__(self, decl: Declarations, keep: Callable[[Origin | None], bool],
                 env: Environment, policy: Policy,
                 excluded_ops: dict[str, Origin], foreign: ForeignOwners | None = None) -> None:
        self.env = env
        #: what packages that register with torch.library directly own (resolver.foreign)
        self.foreign = foreign if foreign is not None else foreign_owners(env.foreign)
        #: what torch's dispatcher holds, when torch is imported (else ``None``)
        self.torch = env.dispatcher
        self.policy = policy
        #: op -> the origin of its (left-out) definer, to explain dangling kernels
        self.excluded_ops = excluded_ops
        self.problems: list[Problem] = []
        # ``decl``'s records come sorted (once, in resolve): filtering keeps them sorted
        self.namespaces: list[Namespace] = [n for n in decl.namespaces if keep(n.origin)]
        self.ops: list[OpDef] = [o for o in decl.ops if keep(o.origin)]
        self.kernels: list[Kernel] = [k for k in decl.kernels if keep(k.origin)]
        self.backends: list[Backend] = [b for b in decl.backends if keep(b.origin)]
        #: every backend declared, left out or not (to check the user's backend choices)
        self.declared_backends: tuple[Backend, ...] = tuple(decl.backends)
        self.available = decl.available
        #: (namespace, distribution) -> the native library whose TORCH_LIBRARY defines its ops
        self.natives = {(n.name, dist_name(n.origin)): n.native
                        for n in self.namespaces if n.native is not None}

    def refuse(self, code: str, message: str, hint: str, culprits: Iterable[Origin | None],
               **kw: Any) -> None:
        """An error: every distribution in ``culprits`` is left out whole (rule 9)."""
        unique = sorted({o for o in culprits if o is not None})
        self.problems.append(Problem(code=code, message=message, hint=hint,
                                     culprits=tuple(unique), **kw))

    def warn(self, code: str, message: str, hint: str, severity: str = "warning",
             **kw: Any) -> None:
        """A warning or note: reported, changes nothing."""
        self.problems.append(Problem(code=code, message=message, hint=hint, severity=severity,
                                     **kw))

    def installed_torch(self) -> TorchFacts | None:
        """The installed torch's version and tags (read from its files), ``None`` without torch."""
        return self.env.torch

    def torch_owns(self, namespace: str) -> bool:
        """Whether ``namespace`` is torch's: reserved, or held by torch's dispatcher now."""
        return namespace in RESERVED_NAMESPACES or (
            self.torch is not None and namespace in self.torch.namespaces)
