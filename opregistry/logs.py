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
from typing import Any

import structlog

__all__ = ["LOGGER_NAME", "get_logger"]

LOGGER_NAME = "opregistry"


def get_logger(**initial_values: Any) -> Any:
    """A lazy structlog logger writing to the stdlib logger ``opregistry``."""
    return structlog.wrap_logger(logging.getLogger(LOGGER_NAME), **initial_values)
