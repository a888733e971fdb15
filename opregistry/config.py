"""Settings: which plugins load, strictness, override policy.

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
``OPREGISTRY_LOCK``         a lockfile: locked mode, only distributions that
                            match it (name, version, file digests) load.
``OPREGISTRY_CONFIG``       a TOML file with the keys ``plugins``,
                            ``block``, ``strict`` and ``allow_override``.
=========================== ==================================================

Both lists apply to op packages and backends alike; names are compared the
way pip compares them (``My_Pkg`` is ``my-pkg``).  Precedence, highest
first: arguments of :func:`opregistry.load`, environment variables, the
``OPREGISTRY_CONFIG`` file, defaults -- as pip lets ``PIP_*`` variables
override its config file.  A file suits a deployment (reviewed, versioned);
a variable suits one run.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import attrs
from attrs import field, frozen

from .errors import ConfigError

__all__ = ["Settings", "Policy", "canonical_name", "read_config", "autoload_enabled", "CONFIG_VAR"]

#: the environment variable naming the configuration file
CONFIG_VAR = "OPREGISTRY_CONFIG"
#: key in the file -> whether its value is a list of strings (else a bool)
_CONFIG_KEYS: dict[str, bool] = {"plugins": True, "block": True, "allow_override": True,
                                 "strict": False}

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
    #: locked mode: the lockfile (``OPREGISTRY_LOCK``) that admitted code must match
    lock: str | None = None

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
        """Settings from ``environ`` (default ``os.environ``) over the config file.

        Keyword arguments that are not ``None`` take precedence over both.
        """
        env = os.environ if environ is None else environ
        path = env.get(CONFIG_VAR, "").strip()
        file = read_config(path) if path else {}
        allow = _names(env.get("OPREGISTRY_PLUGINS"))
        if allow is None and "plugins" in file:
            allow = frozenset(canonical_name(n) for n in file["plugins"])
        block = _names(env.get("OPREGISTRY_BLOCK"))
        if block is None:
            block = frozenset(canonical_name(n) for n in file.get("block", ()))
        policy = Policy.from_env(env)
        if "OPREGISTRY_ALLOW_OVERRIDE" not in env and "allow_override" in file:
            policy = Policy(allow_override=frozenset(file["allow_override"]))
        settings = cls(
            allow=allow,
            block=block,
            strict=_flag(env.get("OPREGISTRY_STRICT"), bool(file.get("strict", False))),
            policy=policy,
            lock=env.get("OPREGISTRY_LOCK", "").strip() or None,
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        return attrs.evolve(settings, **given) if given else settings


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check an ``OPREGISTRY_CONFIG`` file; :class:`ConfigError` says what is wrong.

    The file is TOML with top-level keys, e.g.::

        plugins = ["mylib", "opregistry-cpu"]   # allow-list
        block = ["brokenpkg"]
        strict = true
        allow_override = ["aten::add.Tensor"]
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    where = f"{CONFIG_VAR}={os.fspath(path)}"
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the file ({exc.strerror or exc}); "
                          f"fix the path or unset {CONFIG_VAR}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from exc
    for key, value in data.items():
        if key not in _CONFIG_KEYS:
            close = difflib.get_close_matches(key, _CONFIG_KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(_CONFIG_KEYS)}"
            raise ConfigError(f"{where}: unknown key {key!r}; {hint}")
        if _CONFIG_KEYS[key]:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: {key} must be a list of strings, e.g. "
                                  f'{key} = ["name"], not {value!r}')
        elif not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")
    return data


def autoload_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``OPREGISTRY_AUTOLOAD`` (default on)."""
    env = os.environ if environ is None else environ
    return _flag(env.get("OPREGISTRY_AUTOLOAD"), True)
