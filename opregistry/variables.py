"""``OPREGISTRY_*`` variables read alone: booleans, the cache's check mode, distribution names.

The autoload reads ``OPREGISTRY_AUTOLOAD`` and the cache reads
``OPREGISTRY_CACHE`` before anything decides whether the pipeline is needed
at all (:mod:`opregistry.idle`), with nothing else imported;
:mod:`opregistry.config` builds the settings on these and re-exports them.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from .errors import ConfigError

__all__ = ["parse_flag", "autoload_enabled", "strict_requested", "canonical_name", "check_mode",
           "COUNTS_VAR", "CHECK_VAR"]

#: count which kernel serves each op call (``opregistry.kernel_counts``)
COUNTS_VAR = "OPREGISTRY_KERNEL_COUNTS"
#: ``OPREGISTRY_CACHE_CHECK=content``: the plan cache stamps every input by content, not by
#: size and modification time
CHECK_VAR = "OPREGISTRY_CACHE_CHECK"
_CHECK_MODES = ("stat", "content")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_ACCEPTED = "1/0, true/false, yes/no or on/off"


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: ``My_Pkg.x`` -> ``my-pkg-x``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_flag(value: str | None, default: bool, variable: str) -> bool:
    """A boolean variable: ``1/0, true/false, yes/no, on/off`` (any case); unset or empty: ``default``.

    :raises ConfigError: any other value, naming ``variable`` and the accepted values.
    """
    if value is None or not value.strip():
        return default
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigError(f"{variable}={value!r} is not a boolean: use {_ACCEPTED}")


def check_mode(environ: Mapping[str, str] | None = None) -> str:
    """``OPREGISTRY_CACHE_CHECK``: ``"stat"`` (unset or empty) or ``"content"``, any case.

    :raises ConfigError: any other value (``contents``, ``sha256``...): a mode
        asked for and silently not applied would be a weaker check than meant.
    """
    env = os.environ if environ is None else environ
    value = env.get(CHECK_VAR)
    mode = (value or "stat").strip().lower() or "stat"
    if mode not in _CHECK_MODES:
        raise ConfigError(f"{CHECK_VAR}={value!r} is not a check mode: use 'stat' (size and "
                          f"modification time, the default) or 'content'")
    return mode


def autoload_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``OPREGISTRY_AUTOLOAD`` (default on); :class:`ConfigError` for a value not a boolean."""
    env = os.environ if environ is None else environ
    return parse_flag(env.get("OPREGISTRY_AUTOLOAD"), True, "OPREGISTRY_AUTOLOAD")


def strict_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``OPREGISTRY_STRICT`` asks for strict mode, read alone; never raises.

    For the autoload entry point, deciding whether an invalid configuration
    must fail ``import torch``: only a variable that clearly says so
    (``1/true/yes/on``) does.
    """
    env = os.environ if environ is None else environ
    return (env.get("OPREGISTRY_STRICT") or "").strip().lower() in _TRUE
