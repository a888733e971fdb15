"""A lockfile of the resolved registry, its fingerprint, and the differences between two.

The lock data is plain JSON built from a :class:`~opregistry.plans.Plan`:
the torch version, which distributions contribute (and at which version), the backends and
their dispatch keys, the namespaces (owner, fragments), every op with its
schema and tags, and every kernel with its origin (``module:function`` and
distribution) and status, and -- the lock proves the code, not only the names -- the
content of every contributing distribution: one sha256 per installed file
and one digest per distribution (:mod:`opregistry.digests`).  Everything is
keyed by name and sorted, so the
data -- and :func:`fingerprint`, the sha256 of its canonical JSON -- does not
depend on the order in which entry points were found.

What the lock leaves out, on purpose:

* absolute paths: file names in ``contents`` are relative (to
  ``site-packages``, as ``RECORD`` writes them);
* source locations (``/home/me/site-packages/...:42``): they differ between
  machines that installed the very same wheels;
* whether a backend can run *on this machine* (CUDA present or not): a lock
  made on a laptop must verify on a GPU node.  A kernel whose backend is
  installed is ``active`` in the lock whether or not its device is present;
* for the same reason, torch's local build label: ``2.13.0+cpu`` and
  ``2.13.0+cu128`` are both locked as ``2.13.0``.

This module never imports torch: ``opregistry lock`` / ``verify`` and
:func:`opregistry.verify_lock` run before torch is imported, e.g. first thing in a job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, TextIO, Union

from .digests import contents, file_differences, short
from .errors import LockMismatchError

if TYPE_CHECKING:
    from .plans import KernelPlan, Plan

__all__ = [
    "PathLike",
    "torch_version",
    "LOCK_VERSION",
    "DEFAULT_LOCKFILE",
    "lock_data",
    "fingerprint",
    "fingerprint_of",
    "write_lock",
    "read_lock",
    "diff_lock",
    "verify_plan",
    "installed",
    "contents_of",
    "not_covered",
    "record_differences",
]

#: Version of the lock format; bumped when a field is added or changes meaning
#: (2: the torch version; 3: ``contents``, the sha256 of every installed file;
#: 4: every kernel's registration ``kind``, which replaces 3's ``triton`` flag, and the
#: files of every module the plan references, wherever it is installed).  A key that
#: no comparison reads (``contents``' ``differs_from_record``, for the reviewer) is
#: no new version: a lock with it and one without read and compare the same.
LOCK_VERSION = 4
#: The file ``opregistry lock`` writes and ``opregistry verify`` reads by default.
DEFAULT_LOCKFILE = "opregistry.lock"

PathLike = Union[str, "os.PathLike[str]"]

# "unavailable" means: installed, but this machine lacks the device.  The lock
# describes what is installed, not the hardware (see the module docstring).
_LOCK_STATUS = {"unavailable": "active"}


def _kernel_entry(k: KernelPlan) -> dict[str, Any]:
    """One kernel in the lock: what :func:`~opregistry.kinds.kernel_fields` shows, and its status.

    Candidates (several kernels for one key) carry their conditions; whether
    one is met depends on the platform and the GPU, which the lock does not
    pin, so their status is ``candidate``.
    """
    from .kinds import kernel_fields

    kernel = k.kernel
    candidate = k.rank is not None and k.status != "overridden"
    return {**kernel_fields(kernel, candidate=candidate),
            "distribution": kernel.origin.distribution if kernel.origin else None,
            "status": "candidate" if candidate else _LOCK_STATUS.get(k.status, k.status),
            "override": kernel.override}


def _kernels(kernels: Any) -> dict[str, Any]:
    # Overridden kernels are kept under "overridden" so that the winner stays
    # the one entry per key: an override is a difference worth reporting.
    # Candidates are kept in the order they are tried.
    out: dict[str, Any] = {}
    for k in sorted(kernels, key=lambda k: (k.kernel.key, k.rank or 0, k.status)):
        entry = _kernel_entry(k)
        if entry["status"] == "candidate":
            out.setdefault(f"{k.kernel.key} (candidates)", []).append(entry)
        elif k.status in ("overridden", "disabled"):
            out.setdefault(f"{k.kernel.key} ({k.status})", []).append(entry)
        else:
            out[k.kernel.key] = entry
    for key, value in out.items():
        if isinstance(value, list) and not key.endswith("(candidates)"):
            value.sort(key=lambda e: (e["distribution"] or "", e["kernel"] or ""))
    return out


def torch_version() -> str | None:
    """The installed torch's version without its local build label; ``None`` without torch.

    Read from the distribution's metadata: importing torch takes seconds and
    would load the registry, and the lock is made and checked before that.
    """
    import importlib_metadata

    try:
        version = importlib_metadata.version("torch")
    except importlib_metadata.PackageNotFoundError:
        return None
    return version.partition("+")[0]


def installed(names: Any) -> dict[str, Any]:
    """The installed distribution of each name (the copy Python imports: first on ``sys.path``).

    Names that are not installed (a plan made of hand-written declarations)
    are left out.
    """
    import importlib_metadata

    from .config import canonical_name

    found = {}
    for name in names:
        try:
            dist = importlib_metadata.distribution(name)
        except importlib_metadata.PackageNotFoundError:
            continue
        if canonical_name(dist.metadata["Name"] or "") == name:
            found[name] = dist
    missing = set(names) - set(found)
    if missing:
        # a dist-info folder not named after its distribution: find it the way
        # discovery does, by the Name of every distribution with entry points
        for dist in importlib_metadata.distributions():
            if not any(ep.group.startswith("opregistry.") for ep in dist.entry_points):
                continue
            name = canonical_name(dist.metadata["Name"] or "")
            if name in missing:
                found[name] = dist
                missing.discard(name)
    return found


def contents_of(distributions: Mapping[str, str], *, on_disk: bool,
                references: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``contents`` of the lock: per installed distribution, its files' sha256 and digest.

    ``on_disk=True`` reads every file (what ``lock`` records and ``verify``
    compares: the content as it is); ``on_disk=False`` takes a wheel file's
    hash from its ``RECORD`` when the file has the size ``RECORD`` gives (a
    cheap fingerprint, equal to the lock's wherever ``RECORD`` is right; see
    :func:`opregistry.digests.contents`).  ``references``:
    per distribution, the modules its plan may run
    (:func:`opregistry.plan_modules.modules_by_distribution`), whose files are
    added where the install's own file list lacks them.
    """
    refs = references or {}
    return {name: contents(dist, trust_record=not on_disk, references=refs.get(name, ()))
            for name, dist in sorted(installed(distributions).items())}


def not_covered(data: Mapping[str, Any]) -> list[str]:
    """``dist: what`` for every file a lock's ``contents`` could not hash (empty: all covered)."""
    return [f"{name}: {what}" for name, record in sorted((data.get("contents") or {}).items())
            if isinstance(record, dict) for what in record.get("not_covered", ())]


def record_differences(data: Mapping[str, Any]) -> list[str]:
    """``dist: file ...`` for every wheel file a lock records otherwise than its ``RECORD`` says.

    The lock records the file as it is on disk (absent, or its own sha256),
    so that the lock verifies against this install; the line is for the
    reviewer: the file was edited after install, or the wheel's ``RECORD`` is
    wrong (a published wheel's can be), and only reading the file tells which.
    """
    out = []
    for name, record in sorted((data.get("contents") or {}).items()):
        if not isinstance(record, dict):
            continue
        files = record.get("files") or {}
        for file, listed in sorted((record.get("differs_from_record") or {}).items()):
            if files.get(file) is None:
                out.append(f"{name}: file {file}: listed in RECORD (sha256 {short(listed)}) "
                           f"but not installed; locked as absent")
            else:
                out.append(f"{name}: file {file}: sha256 {short(files[file])}, RECORD lists "
                           f"{short(listed)}; locked as it is on disk")
    return out


def lock_data(plan: Plan, *, on_disk: bool = False) -> dict[str, Any]:
    """The lock data of ``plan``: plain, sorted JSON-able data, without the fingerprint.

    ``on_disk``: hash every installed file rather than trust a wheel's
    ``RECORD`` where the file's size agrees with it (see :func:`contents_of`);
    :func:`write_lock` and :func:`verify_plan` hash every file.
    """
    from .plan_modules import modules_by_distribution

    excluded = {o.distribution for o in plan.excluded}
    distributions = {o.distribution: o.version for o in plan.distributions
                     if o.distribution not in excluded}
    external: dict[str, Any] = {}
    for k in plan.external_kernels:
        external.setdefault(k.kernel.op, []).append(k)
    # kernel switches (OPREGISTRY_KERNELS, config "kernels") change what serves a call:
    # recorded when set, so that a lock made without them stays as it was
    switches = {"kernel_switches": [f"{text} ({source})" for text, source in plan.switches]} \
        if plan.switches else {}
    # adopted packages (their ops registered by their own import): recorded when there are
    # some, with their files in "contents", so that the locked mode can check them too
    adopted = {a.name: _adopted_entry(a) for a in plan.adoptions if a.active}
    return {
        "lock_version": LOCK_VERSION,
        "torch": torch_version(),
        "distributions": dict(sorted(distributions.items())),
        "excluded": sorted({o.dist for o in plan.excluded}),
        "backends": {
            b.backend.name: {
                "keys": sorted(b.backend.keys),
                "device_type": b.backend.device_type,
                "distribution": b.backend.origin.distribution if b.backend.origin else None,
            }
            for b in sorted(plan.backends, key=lambda b: b.backend.name)
        },
        "namespaces": {
            n.name: {
                "owner": n.owner.distribution if n.owner else None,
                "fragments": sorted({f.distribution for f in n.fragments}),
                "closed": n.closed,
            }
            for n in sorted(plan.namespaces, key=lambda n: n.name)
        },
        "ops": {
            op.op.qualname: {
                "schema": op.op.full_schema,
                "tags": sorted(op.op.tags),
                "distribution": op.op.origin.distribution if op.op.origin else None,
                "kernels": _kernels(op.kernels),
            }
            for op in sorted(plan.ops, key=lambda o: o.op.qualname)
        },
        "external_kernels": {name: _kernels(ks) for name, ks in sorted(external.items())},
        **switches,
        **({"adopted": dict(sorted(adopted.items()))} if adopted else {}),
        "contents": contents_of({**distributions, **{n: e["version"] for n, e in adopted.items()}},
                                on_disk=on_disk, references=modules_by_distribution(plan)),
    }


def _adopted_entry(adopted: Any) -> dict[str, Any]:
    """One adopted distribution in the lock: version, how it loads, what it registers."""
    return {"version": adopted.distribution.version, "load": adopted.load,
            "namespaces": {ns: list(modules) for ns, modules in adopted.modules},
            "ops": sorted(reg.op for reg in adopted.ops()),
            "disabled_kernels": sorted(f"{k.op}:{k.key}" for k in adopted.kernels
                                       if k.disabled_by)}


def _canonical(data: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in data.items() if k != "fingerprint"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def fingerprint_of(data: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of lock data (its ``fingerprint`` field, if any, ignored)."""
    import hashlib  # here: OpenSSL's import is a cost every `import torch` would pay

    return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()


def fingerprint(plan: Plan) -> str:
    """The stable fingerprint of ``plan``: ``sha256:<hex>`` of its canonical lock data.

    Cheap: a wheel's hashes come from ``RECORD`` (:func:`lock_data`'s default), so
    it is the fingerprint :func:`write_lock` writes wherever ``RECORD`` is right.
    """
    return fingerprint_of(lock_data(plan))


def write_lock(plan: Plan, path: PathLike | TextIO) -> dict[str, Any]:
    """Write the lockfile of ``plan`` to ``path`` (or an open text file) and return its data.

    Every file is hashed as it is on disk -- what ``verify`` and the locked
    mode compare -- so that the lock verifies against the install it was
    made on, whatever a wheel's ``RECORD`` says (:func:`record_differences`
    names each file that differs from it).
    """
    data = lock_data(plan, on_disk=True)
    data = {"fingerprint": fingerprint_of(data), **data}
    text = json.dumps(data, indent=2) + "\n"
    if isinstance(path, (str, os.PathLike)):
        Path(path).write_text(text, encoding="utf-8")
    else:
        path.write(text)
    return data


def read_lock(path: PathLike) -> dict[str, Any]:
    """Read a lockfile and check it whole: the one reader of lockfiles.

    ``verify``, the locked mode's gate (:mod:`opregistry.lock_gate`) and
    adoption's lock verdict all read a lockfile here, so that each refuses
    the same files with the same sentence: a file that does not exist, is
    not a regular file (a folder, a FIFO: never opened for a blocking read),
    is not JSON, of another ``lock_version``, has a key of the wrong shape
    (``contents.mypkg.files: expected an object, found a list``), or whose
    ``fingerprint`` is missing or does not match its content (edited by
    hand).  Each raises :class:`~opregistry.LockMismatchError` saying which
    file, what is wrong and what to do; nothing else escapes.
    """
    p = Path(path)
    redo = f"regenerate it with 'opregistry lock -o {p}'"
    data = _parse(p, redo)
    if not isinstance(data, dict) or data.get("lock_version") != LOCK_VERSION:
        found = data.get("lock_version") if isinstance(data, dict) else None
        older = ""
        if isinstance(found, int) and found < 3:
            older = (" (an older opregistry's lock: it records names and versions, not the "
                     "content of the installed files)")
        elif found == 3:
            older = (" (an older opregistry's lock: it leaves out the files of modules the "
                     "plan references outside a distribution's own file list)")
        raise LockMismatchError(
            f"lockfile {str(p)!r} has lock_version {found!r}{older}, this opregistry reads "
            f"{LOCK_VERSION}; {redo}"
        )
    wrong = _shape_error(data, _LOCK, "")
    if wrong is not None:
        raise LockMismatchError(f"lockfile {str(p)!r} is malformed ({wrong}); {redo}")
    recorded, actual = data.get("fingerprint"), fingerprint_of(data)
    if recorded is None:
        raise LockMismatchError(
            f"lockfile {str(p)!r} has no fingerprint (it was edited by hand, or not written by "
            f"'opregistry lock'), so nothing shows that its content is what was locked; {redo}")
    if recorded != actual:
        raise LockMismatchError(
            f"lockfile {str(p)!r} was edited by hand: its fingerprint {recorded} does not match "
            f"its content ({actual}); {redo}")
    return data


def _parse(p: Path, redo: str) -> Any:
    """The JSON value of the file ``p``, read only if it is a regular file."""
    from .regular import read_regular

    try:
        raw, _ = read_regular(str(p))
    except FileNotFoundError:
        raise LockMismatchError(
            f"lockfile {str(p)!r} does not exist; create it with 'opregistry lock -o {p}'"
        ) from None
    except OSError as exc:
        kind = _kind(str(p))
        why, todo = (f"it is {kind}, not a regular file", "give the path of a lockfile") \
            if kind else (exc.strerror or str(exc), "make it readable, or give another")
        raise LockMismatchError(
            f"lockfile {str(p)!r} cannot be read ({why}); {todo} ('opregistry lock -o FILE' "
            f"writes one)") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError: both
        raise LockMismatchError(
            f"lockfile {str(p)!r} is not valid JSON ({exc}); {redo}"
        ) from None


def _kind(path: str) -> str | None:
    """``a folder``, ``a FIFO (named pipe)``...: what ``path`` is when it is there but no
    regular file; ``None`` otherwise.  ``os.stat`` opens nothing, so a FIFO does not block."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


# -- the shape of a lockfile ---------------------------------------------------------
#
# A spec is a type (or a tuple of types: ``None`` for null), or one of the classes
# below.  Only the shape is checked -- which keys hold objects, lists, strings --
# so that every reader (diff, gate, adoption) can index without checking again;
# the values themselves are compared, not judged.


class _List:
    """A list whose every item is ``item``."""

    def __init__(self, item: Any) -> None:
        self.item = item


class _Map:
    """An object (string keys) whose every value is ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _Obj:
    """An object with these ``required`` and ``optional`` keys (others are let be)."""

    def __init__(self, required: Mapping[str, Any], optional: Mapping[str, Any] = {}) -> None:
        self.required, self.optional = dict(required), dict(optional)


_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer",
          float: "a number", bool: "true or false", type(None): "null"}
_STR_OR_NULL = (str, type(None))
_KERNEL = _Obj({}, {"kernel": _STR_OR_NULL, "distribution": _STR_OR_NULL})
#: a key's kernel, or the list under "KEY (overridden)" / "KEY (candidates)"
_KERNELS = _Map((_KERNEL, _List(_KERNEL)))
_STRINGS = _List(str)
_LOCK = _Obj({
    "lock_version": int,
    "torch": _STR_OR_NULL,
    "distributions": _Map(str),
    "excluded": _STRINGS,
    "backends": _Map(_Obj({"keys": _STRINGS, "device_type": _STR_OR_NULL,
                           "distribution": _STR_OR_NULL})),
    "namespaces": _Map(_Obj({"owner": _STR_OR_NULL, "fragments": _STRINGS, "closed": bool})),
    "ops": _Map(_Obj({"schema": str, "tags": _STRINGS, "distribution": _STR_OR_NULL,
                      "kernels": _KERNELS})),
    "external_kernels": _Map(_KERNELS),
    "contents": _Map(_Obj({"install": str, "digest": str, "files": _Map(_STR_OR_NULL)},
                          {"references": _STRINGS, "not_covered": _STRINGS,
                           "differs_from_record": _Map(str)})),
}, {
    "fingerprint": str,
    "kernel_switches": _STRINGS,
    "adopted": _Map(_Obj({"version": str, "load": str, "namespaces": _Map(_STRINGS),
                          "ops": _STRINGS, "disabled_kernels": _STRINGS})),
})


def _key_path(where: str, key: str | int) -> str:
    """``where.key``; ``where[0]`` for a list item; a key that is no plain name quoted."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if key and all(c.isalnum() or c in "_-:" for c in key):
        return f"{where}.{key}" if where else key
    return f"{where}[{json.dumps(key)}]"


def _expected(spec: Any) -> str:
    """What ``spec`` calls for, in words: ``an object``, ``a string or null``."""
    if isinstance(spec, tuple):
        return " or ".join(_expected(s) for s in spec)
    if isinstance(spec, (_Obj, _Map)):
        return "an object"
    if isinstance(spec, _List):
        return "a list"
    return _NAMES.get(spec, spec.__name__)


def _matches(value: Any, spec: Any) -> bool:
    """Whether ``value`` is of the kind ``spec`` calls for, its content not looked at."""
    if isinstance(spec, tuple):
        return any(_matches(value, s) for s in spec)
    if isinstance(spec, (_Obj, _Map)):
        return isinstance(value, dict)
    if isinstance(spec, _List):
        return isinstance(value, list)
    if spec is int or spec is float:  # JSON's true and false are no numbers here
        return isinstance(value, spec) and not isinstance(value, bool)
    return isinstance(value, spec)


def _shape_error(value: Any, spec: Any, where: str) -> str | None:
    """``where.key: expected X, found Y`` for the first part of ``value`` that is not of the
    shape ``spec``; ``None`` when all is."""
    if isinstance(spec, tuple):
        for one in spec:
            if _matches(value, one):
                return _shape_error(value, one, where)
    if not _matches(value, spec):
        found = _NAMES.get(type(value), type(value).__name__)
        return f"{where or 'the lockfile'}: expected {_expected(spec)}, found {found}"
    if isinstance(spec, _List):
        parts: list[tuple[Any, Any, Any]] = [(i, item, spec.item) for i, item in enumerate(value)]
    elif isinstance(spec, _Map):
        parts = [(key, item, spec.value) for key, item in value.items()]
    elif isinstance(spec, _Obj):
        missing = sorted(set(spec.required) - set(value))
        if missing:
            return f"{where or 'the lockfile'}: the key {missing[0]!r} is missing"
        known = {**spec.required, **spec.optional}
        parts = [(key, item, known[key]) for key, item in value.items() if key in known]
    else:
        return None
    for key, item, inner in parts:
        wrong = _shape_error(item, inner, _key_path(where, key))
        if wrong is not None:
            return wrong
    return None
# -- differences -------------------------------------------------------------


def _dist(name: str | None, versions: Mapping[str, str]) -> str:
    if name is None:
        return "<unknown>"
    return f"{name}=={versions[name]}" if name in versions else name


def _describe_kernel(entry: Mapping[str, Any], versions: Mapping[str, str]) -> str:
    return f"{entry.get('kernel')} from {_dist(entry.get('distribution'), versions)}"


def _other_fields(old: Mapping[str, Any], new: Mapping[str, Any], a: str, b: str) -> str:
    """``field: A has x, B has y`` for every field whose value differs."""
    return ", ".join(f"{f}: {a} has {old.get(f)!r}, {b} has {new.get(f)!r}"
                     for f in sorted(set(old) | set(new)) if old.get(f) != new.get(f))


def _diff_names(old: Mapping[str, Any], new: Mapping[str, Any], a: str, b: str,
                describe: Callable[[str, Mapping[str, Any]], str], out: list[str]) -> list[str]:
    """Report the names on one side only into ``out``; return those on both that differ.

    ``describe(name, side)`` names the thing, e.g. ``distribution foo==1.0``.
    """
    changed = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append(f"{describe(name, old)}: in {a}, missing from {b}")
        elif name not in old:
            out.append(f"{describe(name, new)}: in {b}, not in {a}")
        elif old[name] != new[name]:
            changed.append(name)
    return changed


def _diff_kernels(where: str, old: Mapping[str, Any], new: Mapping[str, Any],
                  a: str, b: str, va: Mapping[str, str], vb: Mapping[str, str]) -> list[str]:
    def kernels(entries: Any, versions: Mapping[str, str]) -> str:
        return ", ".join(_describe_kernel(e, versions) for e in entries or []) or "none"

    out = []
    for key in sorted(set(old) | set(new)):
        o, n = old.get(key), new.get(key)
        if o == n:
            continue
        if isinstance(o, list) or isinstance(n, list):  # the "KEY (overridden)" lists
            out.append(f"{where} {key}: {a} has {kernels(o, va)}, {b} has {kernels(n, vb)}")
        elif n is None:
            out.append(f"{where}: {a} has a {key} kernel ({_describe_kernel(o, va)}), {b} has none")
        elif o is None:
            out.append(f"{where}: {b} has a {key} kernel ({_describe_kernel(n, vb)}), {a} has none")
        elif (o.get("kernel"), o.get("distribution"), o.get("setup_context")) != (
                n.get("kernel"), n.get("distribution"), n.get("setup_context")):
            out.append(f"{where} {key} kernel: other origin: {a} has {_describe_kernel(o, va)}, "
                       f"{b} has {_describe_kernel(n, vb)}")
        else:
            out.append(f"{where} {key} kernel ({_describe_kernel(n, vb)}): other "
                       + _other_fields(o, n, a, b))
    return out


def diff_lock(old: Mapping[str, Any], new: Mapping[str, Any], *, old_label: str = "the lockfile",
              new_label: str = "this environment") -> list[str]:
    """Every difference between two lock data, one sentence each; empty when equal.

    ``old_label`` / ``new_label`` name the two sides in the sentences (``"the
    lockfile"`` and ``"this environment"``, or ``"rank 0"`` and ``"rank 3"``).
    """
    a, b = old_label, new_label
    out: list[str] = []
    if old.get("lock_version") != new.get("lock_version"):
        out.append(f"lock format: {a} has version {old.get('lock_version')!r}, "
                   f"{b} has {new.get('lock_version')!r}")
    if old.get("torch") != new.get("torch"):
        out.append(f"torch: other version: {a} has {old.get('torch') or 'no torch'}, "
                   f"{b} has {new.get('torch') or 'no torch'}")
    va: Mapping[str, str] = old.get("distributions", {})
    vb: Mapping[str, str] = new.get("distributions", {})
    for name in _diff_names(va, vb, a, b, lambda n, side: f"distribution {n}=={side[n]}", out):
        out.append(f"distribution {name}: other version: {a} has {va[name]}, {b} has {vb[name]}")
    out += _diff_adopted(old.get("adopted", {}), new.get("adopted", {}), a, b)
    ea, eb = set(old.get("excluded", [])), set(new.get("excluded", []))
    for dist in sorted(ea ^ eb):
        side, other = (a, b) if dist in ea else (b, a)
        out.append(f"distribution {dist}: left out because of a problem in {side}, not in {other}")

    for section, label in (("backends", "backend"), ("namespaces", "namespace")):
        sa, sb = old.get(section, {}), new.get(section, {})
        for name in _diff_names(sa, sb, a, b, lambda n, side, label=label: f"{label} {n}", out):
            out.append(f"{label} {name}: other " + _other_fields(sa[name], sb[name], a, b))

    if old.get("kernel_switches", []) != new.get("kernel_switches", []):
        out.append(f"kernel switches: {a} has {old.get('kernel_switches') or 'none'}, "
                   f"{b} has {new.get('kernel_switches') or 'none'}")

    oa, ob = old.get("ops", {}), new.get("ops", {})

    def describe_op(name: str, side: Mapping[str, Any]) -> str:
        versions = va if side is oa else vb  # the version from the side that has the op
        return f"op {name} (from {_dist(side[name].get('distribution'), versions)})"

    for name in _diff_names(oa, ob, a, b, describe_op, out):
        o, n = oa[name], ob[name]
        if o.get("schema") != n.get("schema"):
            out.append(f"op {name}: other schema: {a} has {o.get('schema')!r}, "
                       f"{b} has {n.get('schema')!r}")
        if o.get("distribution") != n.get("distribution"):
            out.append(f"op {name}: defined by other distribution: {a} has "
                       f"{_dist(o.get('distribution'), va)}, {b} has "
                       f"{_dist(n.get('distribution'), vb)}")
        if o.get("tags") != n.get("tags"):
            out.append(f"op {name}: other tags: {a} has {o.get('tags')}, {b} has {n.get('tags')}")
        out += _diff_kernels(f"op {name}", o.get("kernels", {}), n.get("kernels", {}),
                             a, b, va, vb)

    xa, xb = old.get("external_kernels", {}), new.get("external_kernels", {})
    for name in sorted(set(xa) | set(xb)):
        out += _diff_kernels(f"torch op {name}", xa.get(name, {}), xb.get(name, {}),
                             a, b, va, vb)
    out += _diff_contents(old.get("contents", {}), new.get("contents", {}), a, b,
                          {**va, **_adopted_versions(old)}, {**vb, **_adopted_versions(new)})
    return out


def _adopted_versions(data: Mapping[str, Any]) -> dict[str, str]:
    return {n: e.get("version") for n, e in data.get("adopted", {}).items()}


def _diff_adopted(old: Mapping[str, Any], new: Mapping[str, Any], a: str, b: str) -> list[str]:
    """Every difference in the adopted distributions: which, their versions, what they register."""
    out: list[str] = []
    for name in _diff_names(old, new, a, b,
                            lambda n, side: f"adopted distribution {n}=={side[n].get('version')}",
                            out):
        o, n = old[name], new[name]
        for field in ("version", "load", "namespaces", "disabled_kernels"):
            if o.get(field) != n.get(field):
                out.append(f"adopted distribution {name}: other {field}: {a} has "
                           f"{o.get(field)!r}, {b} has {n.get(field)!r}")
        gone, added = set(o.get("ops", [])) - set(n.get("ops", [])), \
            set(n.get("ops", [])) - set(o.get("ops", []))
        if gone or added:
            out.append(f"adopted distribution {name}: other ops: only in {a}: "
                       f"{sorted(gone) or 'none'}; only in {b}: {sorted(added) or 'none'}")
    return out


def _diff_contents(ca: Mapping[str, Any], cb: Mapping[str, Any], a: str, b: str,
                   va: Mapping[str, str], vb: Mapping[str, str]) -> list[str]:
    """Every file that differs, per distribution both sides have at the same version.

    A distribution on one side only, or at another version, is reported by
    the ``distributions`` comparison already; its files would only repeat it.
    """
    out = []
    for name in sorted(set(ca) | set(cb)):
        if name not in va or name not in vb or va[name] != vb[name]:
            continue
        if name not in ca or name not in cb:
            side = a if name not in ca else b
            out.append(f"distribution {name}: {side} records no content for it (not installed "
                       f"as a distribution Python can find)")
        elif ca[name] != cb[name]:
            out += file_differences(name, ca[name], cb[name], f"in {a}", f"in {b}")
    return out


def _left_out_contents(locked: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The files of locked distributions installed at the locked version but not in the plan.

    The locked mode leaves a distribution whose files changed out of the
    plan; its files are still what ``verify`` must name.
    """
    versions: Mapping[str, str] = locked.get("distributions", {})
    recorded: Mapping[str, Any] = locked.get("contents", {})
    missing = [n for n in versions if n not in current.get("contents", {}) and n in recorded]
    out = []
    for name, dist in sorted(installed(missing).items()):
        if dist.version == versions[name]:
            here = contents(dist, references=recorded[name].get("references", ()))
            out += file_differences(name, recorded[name], here, "in the lockfile",
                                    "in this environment")
    return out


def verify_plan(path: PathLike, plan: Plan, *, uncovered: list[str] | None = None) -> str:
    """Check that ``plan`` is the registry recorded in the lockfile ``path``.

    Returns the fingerprint when they agree; raises
    :class:`~opregistry.LockMismatchError` listing every difference otherwise.
    :func:`opregistry.verify_lock` is this, with the current plan as default.
    ``uncovered``, when given, receives the files neither side could hash
    (:func:`not_covered`): what the comparison could not prove.
    """
    locked = read_lock(path)
    current = lock_data(plan, on_disk=True)
    if uncovered is not None:
        uncovered.extend(sorted(set(not_covered(locked)) | set(not_covered(current))))
    differences = diff_lock(locked, current)
    differences += _left_out_contents(locked, current)
    recorded = locked["fingerprint"]  # read_lock: present, and the content's
    actual = fingerprint_of(current)
    if differences:
        raise LockMismatchError(
            f"the registry of this environment ({actual}) differs from the lockfile "
            f"{str(path)!r} ({recorded}) in {len(differences)} way(s):\n"
            + "\n".join(f"  - {d}" for d in differences)
            + f"\nInstall the locked versions, or, if this environment is the new truth, "
              f"run 'opregistry lock -o {path}'.",
            differences=differences,
        )
    return actual
