"""The library's logger: structlog, routed through the stdlib logger ``opregistry``.

A library must not configure logging.  structlog left unconfigured prints
every event to stdout; routing it through ``logging.getLogger("opregistry")``
means the application decides: by default only warnings reach stderr
(logging's last-resort handler), ``logging.getLogger("opregistry")`` levels
and handlers apply, and an application's ``structlog.configure`` processors
(or ``structlog.testing.capture_logs``) still see every event.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["LOGGER_NAME", "get_logger"]

LOGGER_NAME = "opregistry"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
           "exception": logging.ERROR}


def _drop(*args: Any, **kwargs: Any) -> None:
    return None


class _LazyLogger:
    """Imports structlog on the first event anyone can see, not at ``import opregistry``.

    structlog costs ~30 ms to import, a sixth of the start-up budget of
    ``opregistry list``.  While structlog is not imported nobody can have
    configured it (nor be capturing its events), so the stdlib logger's level
    decides exactly whether an event would be shown; a dropped event then
    never imports structlog.  Once structlog is imported (by the application,
    by ``structlog.testing.capture_logs``, or by an emitted event), every
    event goes through it, as before.
    """

    __slots__ = ("_initial", "_logger")

    def __init__(self, initial: dict[str, Any]) -> None:
        self._initial = initial
        self._logger: Any = None

    def _real(self) -> Any:
        if self._logger is None:
            import structlog

            self._logger = structlog.wrap_logger(logging.getLogger(LOGGER_NAME), **self._initial)
        return self._logger

    def __getattr__(self, name: str) -> Any:
        level = _LEVELS.get(name)
        if (level is not None and self._logger is None and "structlog" not in sys.modules
                and not logging.getLogger(LOGGER_NAME).isEnabledFor(level)):
            return _drop
        return getattr(self._real(), name)


def get_logger(**initial_values: Any) -> Any:
    """A lazy structlog logger writing to the stdlib logger ``opregistry``."""
    return _LazyLogger(initial_values)
