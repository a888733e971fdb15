"""``python -m opregistry`` is the ``opregistry`` command."""

from __future__ import annotations

__all__: list[str] = []

if __name__ == "__main__":
    from .cli import run

    run()
