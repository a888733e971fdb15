"""The one rule for exceptions raised by code opregistry did not write.

Third-party code runs in many places (docs/reliability.md lists them):
importing declaration and kernel modules, calling hooks, backend hooks.
Whatever it raises -- ``Exception``, ``SystemExit`` (a module that parses
``sys.argv`` at import), a custom ``BaseException`` subclass -- is a problem of
its distribution: the distribution is left out whole and the others load.

One exception is not the plugin's: a **real Ctrl-C**.  Python delivers SIGINT
as ``KeyboardInterrupt`` raised wherever the main thread happens to be, very
likely inside a plugin's import.  :func:`interrupts_watched` installs a SIGINT
handler for the duration of the pipeline that notes a real signal before
raising; :func:`must_propagate` then tells a real Ctrl-C (propagates: the
process stops, as the user asked) from a ``KeyboardInterrupt`` that plugin
code raised itself (contained like any other exception).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator

from .state import process

__all__ = ["interrupts_watched", "must_propagate", "contain", "describe"]


@contextlib.contextmanager
def interrupts_watched() -> Iterator[None]:
    """Note every real SIGINT while third-party code runs (main thread only; nests)."""
    state = process()
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are delivered to the main thread only: none can arrive here
        return
    with state.interrupt_lock:
        state.interrupt_depth += 1
        outer = state.interrupt_depth == 1
    previous: Any = None
    if outer:
        state.interrupted.clear()
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            state.interrupted.set()
            if callable(previous) and previous is not on_sigint:
                previous(signum, frame)
            else:
                raise KeyboardInterrupt

        try:
            signal.signal(signal.SIGINT, on_sigint)
        except (ValueError, OSError):  # an embedded interpreter without signal support
            previous = None
            outer = False
    try:
        yield
    finally:
        with state.interrupt_lock:
            state.interrupt_depth -= 1
        if outer:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def must_propagate(exc: BaseException) -> bool:
    """Whether ``exc``, caught around plugin code, must stop the process instead of being contained.

    Only a ``KeyboardInterrupt`` that a real SIGINT caused (seen by
    :func:`interrupts_watched`) propagates; ``GeneratorExit`` too (it is
    Python's own, never a plugin's failure).
    """
    if isinstance(exc, KeyboardInterrupt):
        return process().interrupted.is_set()
    return isinstance(exc, GeneratorExit)


def contain(fn: Callable[..., Any], /, *args: Any, **kwargs: Any
            ) -> tuple[Any, BaseException | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, exc)`` for whatever it raised but a real Ctrl-C.

    The one way opregistry catches what code it did not write raises
    (:func:`opregistry.guard.run` adds the watch on torch around it).
    """
    try:
        return fn(*args, **kwargs), None
    except BaseException as exc:  # noqa: BLE001 - third-party code: contained by this rule
        if must_propagate(exc):
            raise
        return None, exc


def describe(exc: BaseException) -> str:
    """``Type: message`` of a caught exception, never raising (a plugin's ``__str__`` may)."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not escape either
        text = "<exception whose str() failed>"
    name = type(exc).__name__
    if isinstance(exc, SystemExit):
        return f"SystemExit: {exc.code} (the plugin called sys.exit())"
    return f"{name}: {text}" if text else name
