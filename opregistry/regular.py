"""Files of installed distributions, opened only when they are regular files.

opregistry reads files that installed distributions own -- the scan reads
every Python file and shared library of every distribution, the locked mode
hashes them, the plan cache stamps them -- without importing them.  A FIFO, a
device or a folder among them (a ``pkg/x.py`` made by ``mkfifo``, a link to
``/dev/zero``) would block the read for ever or never reach its end, at
``import torch``: such a file is refused here with an :class:`OSError`, as
an unreadable file is, and its caller goes on without it.  The file is
opened without blocking (``O_NONBLOCK``, which a regular file ignores) and
judged by ``fstat`` of the open file, so a file swapped between a check and
the open cannot slip through.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO, Any, Callable, Iterator

__all__ = ["open_fd", "open_regular", "read_regular", "walk"]

_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)


def open_fd(path: str) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path``, open for reading, and its ``fstat``.

    ``OSError`` (``EINVAL``, "not a regular file") for anything else.
    """
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd, st


def open_regular(path: str, mode: str = "rb", **kwargs: Any) -> IO[Any]:
    """``open(path, mode, **kwargs)`` for reading, refusing what is not a regular file."""
    fd, _ = open_fd(path)
    try:
        return open(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path``, read whole, and its ``fstat`` (taken
    before the read).

    One ``os.read`` of the size ``fstat`` gives (and what a file that grew
    since holds beyond it): a third faster per file than ``open().read()``,
    which matters for the thousands of files the scan reads.  ``OSError`` as
    :func:`open_fd`'s, or the read's.
    """
    fd, st = open_fd(path)
    try:
        data = os.read(fd, st.st_size + 1)
        if len(data) > st.st_size:  # it grew since: the rest
            data += b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    return data, st


def walk(root: str, skip: Callable[[str], bool] = lambda name: False
         ) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root)`` that follows links to folders (a package's folder may be a link to
    one shared elsewhere), each real folder once (a link loop ends), ``skip``'s folder names
    left out; ``dirs`` and ``files`` sorted."""
    seen: set[str] = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not skip(d))
        files.sort()
        yield folder, dirs, files
