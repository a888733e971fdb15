"""The library's logger: structlog, routed through the stdlib logger ``opregistry``.

A library must not configure logging.  structlog left unconfigured prints
every event to stdout; routing it through ``logging.getLogger("opregistry")``
means the application decides: by default only warnings reach stderr
(logging's last-resort handler), ``logging.getLogger("opregistry")`` levels
and handlers apply, and an application's ``structlog.configure`` processors
(or ``structlog.testing.capture_logs``) still see every event.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["LOGGER_NAME", "get_logger", "configure"]

LOGGER_NAME = "opregistry"

# logging's own numbers (logging.DEBUG ...): this module does not import logging until an
# event may be shown
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50,
           "exception": 40}
#: the level an unconfigured ``logging`` shows (the root logger's WARNING)
_SHOWN_UNCONFIGURED = 30
#: ``(level, configure)``: the configuration :func:`configure` deferred
_pending: tuple[int, Callable[[], None]] | None = None


def configure(level: int, apply: Callable[[], None]) -> None:
    """Configure the ``opregistry`` logger with ``apply`` (which imports ``logging``) -- now
    if ``logging`` is imported, else when an event at ``level`` or above is first emitted,
    or an event of any level once something else has imported ``logging``.

    ``logging`` costs ~10 ms to import, a tenth of ``opregistry list``; a
    command that shows errors only (the CLI's default) and emits none never
    imports it.
    """
    global _pending
    if "logging" in sys.modules:
        _pending = None
        apply()
    else:
        _pending = (level, apply)


def _apply_pending() -> None:
    global _pending
    if _pending is not None:
        apply, _pending = _pending[1], None
        apply()


def _drop(*args: Any, **kwargs: Any) -> None:
    return None


class _LazyLogger:
    """Imports structlog on the first event anyone can see, not at ``import opregistry``.

    structlog costs ~30 ms to import, a sixth of the start-up budget of
    ``opregistry list``.  While structlog is not imported nobody can have
    configured it (nor be capturing its events), so the stdlib logger's level
    decides exactly whether an event would be shown; a dropped event then
    never imports structlog.  While ``logging`` is not imported either,
    nobody configured it: an event below WARNING (or below the level a
    deferred :func:`configure` shows) is dropped without importing it.  Once
    structlog is imported (by the application, by
    ``structlog.testing.capture_logs``, or by an emitted event), every event
    goes through it, as before.
    """

    __slots__ = ("_initial", "_logger")

    def __init__(self, initial: dict[str, Any]) -> None:
        self._initial = initial
        self._logger: Any = None

    def _real(self) -> Any:
        if self._logger is None:
            import logging

            import structlog

            self._logger = structlog.wrap_logger(logging.getLogger(LOGGER_NAME), **self._initial)
        return self._logger

    def __getattr__(self, name: str) -> Any:
        level = _LEVELS.get(name)
        if level is not None and self._logger is None and "structlog" not in sys.modules:
            if "logging" not in sys.modules:
                if level < (_SHOWN_UNCONFIGURED if _pending is None else _pending[0]):
                    return _drop
            else:
                import logging

                _apply_pending()
                if not logging.getLogger(LOGGER_NAME).isEnabledFor(level):
                    return _drop
        _apply_pending()
        return getattr(self._real(), name)


def get_logger(**initial_values: Any) -> Any:
    """A lazy structlog logger writing to the stdlib logger ``opregistry``."""
    return _LazyLogger(initial_values)
