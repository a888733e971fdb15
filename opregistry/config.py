"""Settings from the environment: which plugins load, strictness, override policy.

=========================== ==================================================
``OPREGISTRY_PLUGINS``      allow-list: comma-separated distribution names;
                            unset loads all, an empty string loads none.
``OPREGISTRY_BLOCK``        block-list: distributions never loaded.
``OPREGISTRY_STRICT``       ``1``: any problem raises before anything is
                            registered.
``OPREGISTRY_AUTOLOAD``     ``0``: ``import torch`` does not load the registry.
``OPREGISTRY_ALLOW_OVERRIDE`` namespaces (``aten``) or ops (``mylib::foo``)
                            whose kernels a declaration with
                            ``override=True`` may replace.
=========================== ==================================================

Both lists apply to op packages and backends alike; names are compared the
way pip compares them (``My_Pkg`` is ``my-pkg``).
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

import attrs
from attrs import field, frozen

__all__ = ["Settings", "Policy", "canonical_name"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: ``My_Pkg.x`` -> ``my-pkg-x``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    return frozenset(canonical_name(v.strip()) for v in value.split(",") if v.strip())


def _flag(value: str | None, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    return value.strip().lower() in _TRUE or (value.strip().lower() not in _FALSE and default)


def _to_frozenset(value: Iterable[str] | None) -> frozenset[str] | None:
    return None if value is None else frozenset(canonical_name(v) for v in value)


@frozen(kw_only=True)
class Policy:
    """What may replace a kernel registered by someone else.

    ``allow_override`` holds namespaces (``"aten"``) and ops
    (``"mylib::foo"``).  A kernel that replaces another distribution's, or
    implements a torch-owned op, needs both ``override=True`` on its
    declaration (for torch-owned ops without an existing kernel, the
    namespace in the policy is enough) and its namespace or op here.
    """

    allow_override: frozenset[str] = field(default=frozenset(), converter=frozenset)

    def allows(self, op: str) -> bool:
        namespace = op.split("::", 1)[0]
        base = op.split(".", 1)[0]
        return bool({namespace, op, base} & self.allow_override)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Policy:
        env = os.environ if environ is None else environ
        raw = env.get("OPREGISTRY_ALLOW_OVERRIDE", "")
        return cls(allow_override=frozenset(v.strip() for v in raw.split(",") if v.strip()))


@frozen(kw_only=True)
class Settings:
    """Everything that steers discovery and resolution, from one place."""

    allow: frozenset[str] | None = field(default=None, converter=_to_frozenset)
    block: frozenset[str] = field(default=frozenset(), converter=lambda v: _to_frozenset(v) or frozenset())
    strict: bool = False
    policy: Policy = field(factory=Policy)

    def admits(self, distribution: str) -> str | None:
        """``None`` if ``distribution`` may load, else why not."""
        name = canonical_name(distribution)
        if name in self.block:
            return "blocked by OPREGISTRY_BLOCK"
        if self.allow is not None and name not in self.allow:
            return "not in OPREGISTRY_PLUGINS"
        return None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if environ is None else environ
        settings = cls(
            allow=_names(env.get("OPREGISTRY_PLUGINS")),
            block=_names(env.get("OPREGISTRY_BLOCK")) or frozenset(),
            strict=_flag(env.get("OPREGISTRY_STRICT"), False),
            policy=Policy.from_env(env),
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        return attrs.evolve(settings, **given) if given else settings


def autoload_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``OPREGISTRY_AUTOLOAD`` (default on)."""
    env = os.environ if environ is None else environ
    return _flag(env.get("OPREGISTRY_AUTOLOAD"), True)
