"""Settings: which plugins load, strictness, override policy, which backend serves a key.

=============================== ===========================================
Both lists apply to op packages and backends alike; names are compared the
way pip compares them (``My_Pkg`` is ``my-pkg``).  Precedence, highest
first: arguments of :func:`opregistry.load`, environment variables, the
``OPREGISTRY_CONFIG`` file, defaults -- as pip lets ``PIP_*`` variables
override its config file.  A file suits a deployment (reviewed, versioned);
a variable suits one run.

Every value is validated: a boolean is one of ``1/0``, ``true/false``,
``yes/no``, ``on/off`` (any case); anything else -- and an unreadable or
malformed file, an unknown key, an unknown dispatch key -- raises
:class:`~opregistry.ConfigError`, one line naming the variable or the file.
What can only be checked against the installed distributions (a name in a
list that is not installed, an ``OPREGISTRY_*`` variable nobody reads) is
returned by :meth:`Settings.findings`, which discovery turns into problems.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import attrs
from attrs import field, frozen

from .errors import ConfigError
from .keys import ALIASES, KNOWN_KEYS
from .variables import (COUNTS_VAR, autoload_enabled, canonical_name, check_mode, parse_flag,
                        strict_requested)

__all__ = ["Settings", "Policy", "canonical_name", "read_config", "autoload_enabled",
           "strict_requested", "parse_flag", "dispatch_key", "CONFIG_VAR", "BACKEND_VAR_PREFIX",
           "KNOWN_VARIABLES", "KERNELS_VAR", "COUNTS_VAR", "ADOPT_VAR", "ADOPT_BLOCK_VAR", "Switch"]

#: the environment variable naming the configuration file
CONFIG_VAR = "OPREGISTRY_CONFIG"
#: ``OPREGISTRY_BACKEND_CPU=dist``: which distribution's backend serves a key
BACKEND_VAR_PREFIX = "OPREGISTRY_BACKEND_"
#: kernel switches, ``-nnkit::rms_norm:CUDA,+nnkit::nms`` (see :class:`Switch`)
KERNELS_VAR = "OPREGISTRY_KERNELS"
#: adoption of packages that register with torch.library by themselves (docs/ecosystem.md):
#: on by default; ``0`` switches it off for every distribution
ADOPT_VAR = "OPREGISTRY_ADOPT"
#: distributions never adopted (comma-separated)
ADOPT_BLOCK_VAR = "OPREGISTRY_ADOPT_BLOCK"
#: every ``OPREGISTRY_*`` variable something reads; any other is reported (a typo)
KNOWN_VARIABLES: set[str] = {
    "OPREGISTRY_PLUGINS", "OPREGISTRY_BLOCK", "OPREGISTRY_STRICT", "OPREGISTRY_AUTOLOAD",
    "OPREGISTRY_ALLOW_OVERRIDE", CONFIG_VAR,
    "OPREGISTRY_LOCK",  # locked mode: Settings.lock, opregistry/lock_gate.py
    "OPREGISTRY_FUZZ_EXAMPLES",  # the test suite's fuzzers
    KERNELS_VAR,  # kernel switches: Policy.kernels
    "OPREGISTRY_KERNEL_COUNTS",  # which kernel ran: opregistry.selection, read by the materializer
    "OPREGISTRY_CACHE", "OPREGISTRY_CACHE_DIR",  # the on-disk caches: opregistry/diskcache.py
    ADOPT_VAR, ADOPT_BLOCK_VAR,  # adoption: Policy.adopt, Policy.adopt_block
    "OPREGISTRY_CACHE_CHECK",  # the plan cache's inputs by content: opregistry/plancache.py
}
#: key in the file -> its kind
_CONFIG_KEYS: dict[str, str] = {"plugins": "list", "block": "list", "allow_override": "list",
                                "strict": "bool", "backends": "table", "kernels": "list",
                                "adopt": "bool", "adopt_block": "list"}

#: ``OPREGISTRY_BACKEND_<suffix>`` / a ``backends`` key -> torch's key name
_KEY_NAMES: dict[str, str] = {**{a.upper(): k for a, k in ALIASES.items()},
                              **{k.upper(): k for k in KNOWN_KEYS}}


def _did_you_mean(word: str, choices: Iterable[str], *, what: str = "") -> str:
    choices = sorted(set(choices))
    import difflib  # here: only a mistake needs it

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    if what and choices:
        shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
        return f"{what}: {shown}"
    return ""


def _names(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    return frozenset(canonical_name(v.strip()) for v in value.split(",") if v.strip())


def _to_frozenset(value: Iterable[str] | None) -> frozenset[str] | None:
    return None if value is None else frozenset(canonical_name(v) for v in value)


def dispatch_key(name: str, where: str) -> str:
    """torch's name of the dispatch key ``name`` (``cpu``, ``CPU``, ``PRIVATEUSE1``)."""
    key = _KEY_NAMES.get(name.strip().upper())
    if key is None:
        hint = _did_you_mean(name.strip().upper(), [k.upper() for k in KNOWN_KEYS],
                             what="known keys")
        raise ConfigError(f"{where}: {name!r} is not a dispatch key; {hint}")
    return key


def _to_backends(value: Mapping[str, str] | Iterable[tuple[str, str]] | None
                 ) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    pairs = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((dispatch_key(k, "backends"), canonical_name(d)) for k, d in pairs))


_OP_TARGET = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*(\.[A-Za-z_]\w*)?\Z")
_DIST_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


@frozen
class Switch:
    """One kernel switch: ``-`` disables, ``+`` enables again, what ``target`` selects.

    ``target`` is ``ns::op`` (the op's custom kernels: every device kernel but a
    plain ``default`` one), ``ns::op:KEY`` (every kernel of the op for one key)
    or a distribution (every device kernel it declares).  ``source`` is where
    the switch was set, for messages.
    """

    enable: bool
    op: str | None = None
    key: str | None = None
    distribution: str | None = None
    source: str = field(default=KERNELS_VAR, eq=False)

    @property
    def text(self) -> str:
        target = self.distribution or (f"{self.op}:{self.key}" if self.key else self.op)
        return f"{'+' if self.enable else '-'}{target}"

    def matches(self, op: str, key: str, distribution: str, composite: bool,
                conditional: bool) -> bool:
        if self.distribution is not None:
            return distribution == self.distribution
        if op != self.op and op.split(".", 1)[0] != self.op:
            return False
        if self.key is not None:
            return key == self.key
        return conditional or not composite

    @classmethod
    def parse(cls, text: str, where: str) -> Switch:
        """``-nnkit::rms_norm:CUDA`` as a :class:`Switch`; :class:`ConfigError` for bad syntax."""
        entry = text.strip()
        example = "e.g. -nnkit::rms_norm, -nnkit::rms_norm:CUDA or -nnkit-contrib"
        if entry[:1] not in ("-", "+") or len(entry) < 2:
            raise ConfigError(f"{where}: {text!r} must start with '-' (disable) or '+' "
                              f"(enable); {example}")
        enable, target = entry[0] == "+", entry[1:].strip()
        if "::" in target:
            op, _, key = target.partition("::")[2].partition(":")
            op = target.split("::", 1)[0] + "::" + op
            if not _OP_TARGET.match(op):
                raise ConfigError(f"{where}: {text!r}: {op!r} is not an op name "
                                  f"(namespace::name[.overload]); {example}")
            return cls(enable=enable, op=op, key=dispatch_key(key, f"{where}: {text!r}")
                       if key else None, source=where)
        if not _DIST_TARGET.match(target):
            raise ConfigError(f"{where}: {text!r}: {target!r} is neither an op "
                              f"(namespace::name) nor a distribution name; {example}")
        return cls(enable=enable, distribution=canonical_name(target), source=where)


def _switches(value: str | None, where: str) -> tuple[Switch, ...]:
    if value is None:
        return ()
    return tuple(Switch.parse(v, where) for v in value.split(",") if v.strip())


@frozen(kw_only=True)
class Policy:
    """What the user decides about resolution: overrides, and backend choices.

    ``allow_override`` holds namespaces (``"aten"``) and ops
    (``"mylib::foo"``).  A kernel that replaces another distribution's, or
    implements a torch-owned op, needs both ``override=True`` on its
    declaration (for torch-owned ops without an existing kernel, the
    namespace in the policy is enough) and its namespace or op here.

    ``backends`` maps a dispatch key to the distribution whose backend
    serves it when several installed backends declare the key
    (``{"CPU": "my-cpu"}``); see :func:`opregistry.resolver.backend_choice.check_backends`.
    """

    allow_override: frozenset[str] = field(default=frozenset(), converter=frozenset)
    backends: tuple[tuple[str, str], ...] = field(default=(), converter=_to_backends)
    #: where each backend choice came from (``OPREGISTRY_BACKEND_CPU``, the file), for messages
    backend_sources: Mapping[str, str] = field(factory=dict, eq=False, hash=False)
    #: kernel switches, in order: the last that matches a kernel decides
    kernels: tuple[Switch, ...] = field(default=(), converter=tuple)
    #: adopt packages that register with torch.library by themselves (``OPREGISTRY_ADOPT``)
    adopt: bool = True
    #: distributions never adopted (``OPREGISTRY_ADOPT_BLOCK``)
    adopt_block: frozenset[str] = field(default=frozenset(),
                                        converter=lambda v: _to_frozenset(v) or frozenset())
    #: where ``adopt`` / ``adopt_block`` were set, for messages
    adopt_sources: Mapping[str, str] = field(factory=dict, eq=False, hash=False)

    def adopts(self, distribution: str) -> str | None:
        """``None`` if ``distribution`` may be adopted, else why not (the switch that says so)."""
        if not self.adopt:
            return f"adoption switched off by {self.adopt_sources.get('adopt', ADOPT_VAR)}"
        if canonical_name(distribution) in self.adopt_block:
            return f"named in {self.adopt_sources.get('adopt_block', ADOPT_BLOCK_VAR)}"
        return None

    def disabled_by(self, op: str, key: str, distribution: str, composite: bool,
                    conditional: bool) -> Switch | None:
        """The switch that disables this kernel, or ``None`` (none, or a later ``+`` enables it)."""
        found = None
        for switch in self.kernels:
            if switch.matches(op, key, distribution, composite, conditional):
                found = None if switch.enable else switch
        return found

    def allows(self, op: str) -> bool:
        namespace = op.split("::", 1)[0]
        base = op.split(".", 1)[0]
        return bool({namespace, op, base} & self.allow_override)

    def backend_for(self, key: str) -> str | None:
        """The distribution the user chose to serve ``key``, if any."""
        return dict(self.backends).get(key)

    def backend_source(self, key: str) -> str:
        """Where the choice for ``key`` was made, for messages."""
        return self.backend_sources.get(key, f"{BACKEND_VAR_PREFIX}{key.upper()}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Policy:
        env = os.environ if environ is None else environ
        raw = env.get("OPREGISTRY_ALLOW_OVERRIDE", "")
        backends, sources = _env_backends(env)
        return cls(allow_override=frozenset(v.strip() for v in raw.split(",") if v.strip()),
                   backends=backends, backend_sources=sources,
                   kernels=_switches(env.get(KERNELS_VAR), KERNELS_VAR),
                   adopt=parse_flag(env.get(ADOPT_VAR), True, ADOPT_VAR),
                   adopt_block=_names(env.get(ADOPT_BLOCK_VAR)) or frozenset())


def _env_backends(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``OPREGISTRY_BACKEND_<KEY>=dist`` variables: key -> distribution, key -> variable."""
    chosen: dict[str, str] = {}
    sources: dict[str, str] = {}
    for variable in sorted(env):
        if not variable.startswith(BACKEND_VAR_PREFIX):
            continue
        value = env[variable].strip()
        if not value:
            continue
        key = dispatch_key(variable[len(BACKEND_VAR_PREFIX):], variable)
        if "," in value or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ConfigError(f"{variable}={env[variable]!r}: name one distribution "
                              f"(e.g. {variable}=opregistry-{key.lower()})")
        if key in chosen and chosen[key] != canonical_name(value):
            raise ConfigError(f"{variable} and {sources[key]} both choose the backend of {key}: "
                              f"set one of them")
        chosen[key] = canonical_name(value)
        sources[key] = variable
    return chosen, sources


@frozen(kw_only=True)
class Settings:
    """Everything that steers discovery and resolution, from one place."""

    allow: frozenset[str] | None = field(default=None, converter=_to_frozenset)
    block: frozenset[str] = field(default=frozenset(), converter=lambda v: _to_frozenset(v) or frozenset())
    strict: bool = False
    policy: Policy = field(factory=Policy)
    #: ``"allow"`` / ``"block"`` -> where the list came from, for messages
    sources: Mapping[str, str] = field(factory=dict, eq=False, hash=False)
    #: ``OPREGISTRY_*`` variables set in the environment that nothing reads
    unknown_variables: tuple[str, ...] = field(default=(), eq=False)
    #: locked mode: the lockfile (``OPREGISTRY_LOCK``) that admitted code must match
    lock: str | None = None

    def admits(self, distribution: str) -> str | None:
        """``None`` if ``distribution`` may load, else why not."""
        name = canonical_name(distribution)
        if name in self.block:
            return f"blocked by {self.sources.get('block', 'OPREGISTRY_BLOCK')}"
        if self.allow is not None and name not in self.allow:
            return f"not in {self.sources.get('allow', 'OPREGISTRY_PLUGINS')}"
        return None

    def findings(self, installed: Iterable[str]) -> list[tuple[str, str, str, str]]:
        """What only the installed distributions tell: ``(code, severity, message, hint)`` each.

        ``installed`` are the (canonical) names of the distributions that
        have opregistry entry points.  A name in the allow- or block-list that
        is none of them is an error (``config-unknown-distribution``): a typo
        in the allow-list loads nothing, one in the block-list loads what was
        meant to be blocked.  An ``OPREGISTRY_*`` variable nothing reads is a
        warning (``config-unknown-variable``).
        """
        installed = sorted(set(installed))
        found = []
        for which, names in (("allow", self.allow or ()), ("block", self.block)):
            where = self.sources.get(which, "OPREGISTRY_PLUGINS" if which == "allow"
                                     else "OPREGISTRY_BLOCK")
            for name in sorted(set(names) - set(installed)):
                hint = _did_you_mean(name, installed)
                found.append((
                    "config-unknown-distribution", "error",
                    f"{where} names {name!r}, which is not an installed distribution with "
                    f"opregistry plugins" + (f"; {hint}" if hint else ""),
                    f"correct the name in {where}" + (
                        f" (installed: {', '.join(installed[:12])}"
                        f"{', ...' if len(installed) > 12 else ''})" if installed else "")
                    + f", or install {name}",
                ))
        known = KNOWN_VARIABLES
        for variable in self.unknown_variables:
            hint = _did_you_mean(variable, known)
            found.append((
                "config-unknown-variable", "warning",
                f"{variable} is set but opregistry reads no such variable"
                + (f"; {hint}" if hint else ""),
                f"rename or unset {variable}; the variables are "
                f"{', '.join(sorted(known - {'OPREGISTRY_FUZZ_EXAMPLES'}))} and "
                f"{BACKEND_VAR_PREFIX}<KEY>",
            ))
        return found

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``environ`` (default ``os.environ``) over the config file.

        Keyword arguments that are not ``None`` take precedence over both.

        :raises ConfigError: an invalid value or file, naming the variable or the file.
        """
        env = os.environ if environ is None else environ
        path = env.get(CONFIG_VAR, "").strip()
        file = read_config(path) if path else {}
        in_file = f"{CONFIG_VAR}={path}"
        sources: dict[str, str] = {}
        allow = _names(env.get("OPREGISTRY_PLUGINS"))
        if allow is not None:
            sources["allow"] = "OPREGISTRY_PLUGINS"
        elif "plugins" in file:
            allow = frozenset(canonical_name(n) for n in file["plugins"])
            sources["allow"] = f"{in_file} (key 'plugins')"
        block = _names(env.get("OPREGISTRY_BLOCK"))
        if block is not None:
            sources["block"] = "OPREGISTRY_BLOCK"
        else:
            block = frozenset(canonical_name(n) for n in file.get("block", ()))
            if "block" in file:
                sources["block"] = f"{in_file} (key 'block')"
        policy = Policy.from_env(env)
        allow_override = policy.allow_override
        if "OPREGISTRY_ALLOW_OVERRIDE" not in env and "allow_override" in file:
            allow_override = frozenset(file["allow_override"])
        backends = {k: d for k, d in _to_backends(file.get("backends"))}
        backend_sources = {k: f"{in_file} (backends.{k})" for k in backends}
        backends.update(policy.backends)
        backend_sources.update(policy.backend_sources)
        # the file's switches first, then the variable's: the last that matches decides
        switches = tuple(Switch.parse(v, f"{in_file} (key 'kernels')")
                         for v in file.get("kernels", ())) + policy.kernels
        adopt, adopt_block, adopt_sources = _adoption(env, file, in_file, policy)
        policy = Policy(allow_override=allow_override, backends=backends,
                        backend_sources=backend_sources, kernels=switches, adopt=adopt,
                        adopt_block=adopt_block, adopt_sources=adopt_sources)
        strict_file = bool(file.get("strict", False))
        strict = parse_flag(env.get("OPREGISTRY_STRICT"), strict_file, "OPREGISTRY_STRICT")
        parse_flag(env.get("OPREGISTRY_AUTOLOAD"), True, "OPREGISTRY_AUTOLOAD")  # validated here too
        parse_flag(env.get(COUNTS_VAR), False, COUNTS_VAR)  # read when kernels are registered
        parse_flag(env.get("OPREGISTRY_CACHE"), True, "OPREGISTRY_CACHE")  # read by diskcache
        check_mode(env)  # read by the plan cache
        unknown = tuple(sorted(
            v for v in env if v.startswith("OPREGISTRY_") and v not in KNOWN_VARIABLES
            and not v.startswith(BACKEND_VAR_PREFIX)))
        given = {k: v for k, v in overrides.items() if v is not None}
        if "allow" in given:
            sources["allow"] = "the plugins argument"
        if "block" in given:
            sources["block"] = "the block argument"
        settings = cls(allow=allow, block=block, strict=strict, policy=policy, sources=sources,
                       unknown_variables=unknown,
                       lock=env.get("OPREGISTRY_LOCK", "").strip() or None)
        return attrs.evolve(settings, **given) if given else settings


def _adoption(env: Mapping[str, str], file: Mapping[str, Any], in_file: str, policy: Policy
              ) -> tuple[bool, frozenset[str], dict[str, str]]:
    """``adopt``, ``adopt_block`` and where each was set: the variable over the file."""
    sources: dict[str, str] = {}
    adopt = policy.adopt
    if env.get(ADOPT_VAR, "").strip():
        sources["adopt"] = ADOPT_VAR
    elif "adopt" in file:
        adopt = bool(file["adopt"])
        sources["adopt"] = f"{in_file} (key 'adopt')"
    block = policy.adopt_block
    if env.get(ADOPT_BLOCK_VAR) is not None:
        sources["adopt_block"] = ADOPT_BLOCK_VAR
    elif "adopt_block" in file:
        block = frozenset(canonical_name(n) for n in file["adopt_block"])
        sources["adopt_block"] = f"{in_file} (key 'adopt_block')"
    return adopt, block, sources


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check an ``OPREGISTRY_CONFIG`` file; :class:`ConfigError` says what is wrong.

    The file is TOML with top-level keys, e.g.::

        plugins = ["mylib", "opregistry-cpu"]   # allow-list
        block = ["brokenpkg"]
        strict = true
        allow_override = ["aten::add.Tensor"]
        backends = {CPU = "opregistry-cpu"}     # who serves a key several backends declare
        kernels = ["-nnkit::rms_norm:CUDA"]     # kernel switches (before OPREGISTRY_KERNELS)
        adopt = false                           # adopt no package (OPREGISTRY_ADOPT=0)
        adopt_block = ["bitsandbytes"]          # never adopt these (OPREGISTRY_ADOPT_BLOCK)
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
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not a UTF-8 text file ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from exc
    for key, value in data.items():
        if key not in _CONFIG_KEYS:
            hint = _did_you_mean(key, _CONFIG_KEYS, what="known keys")
            raise ConfigError(f"{where}: unknown key {key!r}; {hint}")
        kind = _CONFIG_KEYS[key]
        if kind == "list":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: {key} must be a list of strings, e.g. "
                                  f'{key} = ["name"], not {value!r}')
            if key == "kernels":
                for v in value:
                    Switch.parse(v, f"{where} (key 'kernels')")
        elif kind == "table":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise ConfigError(f"{where}: {key} must be a table of dispatch key = "
                                  f'"distribution", e.g. {key} = {{CPU = "opregistry-cpu"}}, '
                                  f"not {value!r}")
            for k in value:
                dispatch_key(k, f"{where}: {key}")
        elif not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")
    return data
