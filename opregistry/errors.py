"""The exceptions opregistry raises.

One base class, :class:`OpRegistryError`; every subclass also inherits the
built-in exception that fits, so ``except ValueError`` keeps working for code
that does not know about opregistry.  Every error carries structured
attributes (``distribution``, ``entry_point``, ``op``, ``key``) next to a
message that says what happened, where it came from and what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .model import Origin, Problem

__all__ = [
    "DOCS_URL",
    "OpRegistryError",
    "DeclarationError",
    "SchemaError",
    "PluginLoadError",
    "PluginValidationError",
    "ResolutionError",
    "MaterializationError",
    "LockMismatchError",
    "ConfigError",
    "ReentrantLoadError",
]


#: Where the documentation lives.  Messages and hints name a page there (or
#: ``opregistry help TOPIC``), never a path of the repository, which a user who
#: installed the wheels does not have.
DOCS_URL = "https://opregistry.github.io/opregistry/"


class OpRegistryError(Exception):
    """Base class of every error raised by opregistry."""

    def __init__(
        self,
        message: str,
        *,
        origin: Origin | None = None,
        op: str | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.origin = origin
        self.op = op
        self.key = key

    @property
    def distribution(self) -> str | None:
        """``name==version`` of the distribution at fault, when known."""
        return self.origin.dist if self.origin is not None else None

    @property
    def entry_point(self) -> str | None:
        """The entry point (``name = value``) at fault, when known."""
        return self.origin.entry_point_spec if self.origin is not None else None


class DeclarationError(OpRegistryError, ValueError):
    """A declaration is malformed: a bad name, schema, dispatch key or reference."""


class SchemaError(DeclarationError):
    """An operator schema string does not parse or breaks a schema rule."""


class PluginLoadError(OpRegistryError, ImportError):
    """An entry point could not be loaded (missing module, exception at import)."""


class PluginValidationError(OpRegistryError, TypeError):
    """A plugin's hook implementations do not match the hook specifications."""


class MaterializationError(OpRegistryError, RuntimeError):
    """torch rejected a registration, or a kernel reference did not resolve."""


class ResolutionError(OpRegistryError, RuntimeError):
    """Raised in strict mode when resolution found problems.

    ``problems`` holds every :class:`~opregistry.model.Problem` found, not just
    the first, so one run shows everything that needs fixing.
    """

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        lines = [f"opregistry found {len(self.problems)} problem(s); nothing was registered:"]
        lines += [f"  - {p}" for p in self.problems]
        lines.append("Fix them, or leave strict mode (OPREGISTRY_STRICT=0) to load the rest.")
        first = self.problems[0] if self.problems else None
        # the first problem's own exception (a plugin's ImportError, pluggy's
        # validation error) shows in the traceback as the cause
        if first is not None and first.error is not None:
            self.__cause__ = first.error
        super().__init__(
            "\n".join(lines),
            origin=first.culprits[0] if first and first.culprits else None,
            op=first.op if first else None,
            key=first.key if first else None,
        )


class LockMismatchError(OpRegistryError, RuntimeError):
    """The resolved registry differs from a lockfile or from another rank's.

    ``differences`` holds one sentence per difference (all of them, not just
    the first), for tools that want more than the message.
    """

    def __init__(self, message: str, *, differences: Sequence[str] = (), **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.differences = tuple(differences)


class ConfigError(OpRegistryError, ValueError):
    """The configuration (``OPREGISTRY_CONFIG`` file or an environment variable) is invalid."""


class ReentrantLoadError(OpRegistryError, RuntimeError):
    """``load()`` or ``plan()`` was called while opregistry was importing plugins.

    A plugin that calls them at import would register from inside the
    registry's own load; the plugin is reported (``plugin-import-error``) instead.
    """
