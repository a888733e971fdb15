"""``opregistry check``: opcheck and gradcheck over every op's sample inputs.

For each selected op that the loaded registry registered, on every device
that has an active kernel for it and is available on this machine, every
sample input declared with ``samples=`` goes through
:func:`torch.library.opcheck` with all its default test utilities
(``test_schema``, ``test_autograd_registration``, ``test_faketensor``,
``test_aot_dispatch_dynamic``), and through :func:`torch.autograd.gradcheck`
when an Autograd kernel is active and the sample has inputs that require
grad.  Results are plain records; the CLI prints them.

This module imports torch (inside its functions, so that importing
:mod:`opregistry.cli` does not).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import attrs
from attrs import frozen

from . import guard
from . import keys as _keys
from .containment import contain
from .guard import resolve_ref
from .model import Origin

if TYPE_CHECKING:
    from .registry import Registry
    from .plans import OpPlan

__all__ = ["OPCHECK_UTILS", "GRADCHECK", "CheckResult", "select_ops", "devices_for", "samples_of",
           "adopted_names", "names_adopted", "run_checks"]

#: torch.library.opcheck's default test utilities, in the order it runs them.
OPCHECK_UTILS: tuple[str, ...] = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)
GRADCHECK = "gradcheck"


@frozen(kw_only=True)
class CheckResult:
    """The outcome of one check of one op, on one device, for one sample.

    ``check`` is an opcheck utility, ``"gradcheck"``, ``"registered"`` (the
    op is not in torch: it was left out), or ``"samples"`` (the sample
    function itself failed, the op declares none, or no device can run it); ``status`` is
    ``"ok"``, ``"fail"`` or ``"skip"``; ``message`` says why, for the latter two.
    """

    op: str
    device: str
    check: str
    status: str
    sample: int | None = None
    message: str = ""
    distribution: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def select_ops(ops: Sequence[OpPlan], targets: Iterable[str]) -> tuple[list[OpPlan], list[str]]:
    """The ops named by ``targets`` (``ns`` or ``ns::op[.overload]``), and the unknown targets."""
    targets = list(targets)
    if not targets:
        return list(ops), []
    chosen: dict[str, OpPlan] = {}
    unknown = []
    for target in targets:
        if "::" in target:
            hits = [op for op in ops if target in (op.op.qualname, op.op.base_qualname)]
        else:
            hits = [op for op in ops if op.op.namespace == target]
        if not hits:
            unknown.append(target)
        for op in hits:
            chosen[op.op.qualname] = op
    return [chosen[name] for name in sorted(chosen)], unknown


def devices_for(op: OpPlan, available_devices: Iterable[str]) -> list[str]:
    """Device types with an active kernel for ``op`` that this machine can run."""
    available = set(available_devices)
    devices = []
    for k in op.kernels:
        if k.status == "active" and k.kernel.key in _keys.COMPOSITE_KEYS:
            devices.extend(available)  # a kernel for every device: check it on each
        device = _keys.DEVICE_KEYS.get(k.kernel.key)
        if k.status in ("active", "native") and device in available:
            devices.append(device)
    return sorted(set(devices), key=lambda d: (d != "cpu", d))


def _available_devices() -> dict[str, str]:
    """Device types this machine can run: opregistry's name -> torch's device string.

    Asked through the public ``torch.accelerator`` API.  An out-of-tree device
    renamed from ``privateuseone`` (``torch.utils.rename_privateuse1_backend``)
    is served by kernels declared for ``PrivateUse1``: its opregistry name is
    ``privateuseone``, its torch string the new name.
    """
    import torch

    devices = {"cpu": "cpu"}
    if torch.accelerator.is_available():
        kind = torch.accelerator.current_accelerator().type
        name = kind if kind in _keys.DEVICE_KEYS.values() else "privateuseone"
        devices[name] = kind
    return devices


def samples_of(op: OpPlan) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The op's sample inputs as ``(args, kwargs)`` pairs; raises ``TypeError`` if malformed."""
    if op.op.samples is None:
        return []
    return _samples(op.op.samples, op.op.qualname)


def _samples(ref: Any, qualname: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    produced = resolve_ref(ref)()
    out = []
    for i, sample in enumerate(produced):
        if hasattr(sample, "args"):
            args, kwargs = sample.args, getattr(sample, "kwargs", None) or {}
        elif isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict):
            args, kwargs = sample
        else:
            raise TypeError(
                f"sample {i} of {qualname} is a {type(sample).__name__}; a sample function "
                f"returns a list of (args, kwargs) pairs"
            )
        out.append((tuple(args), dict(kwargs)))
    return out


def _to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        moved = value.detach().to(device)
        return moved.requires_grad_(value.requires_grad) if value.is_floating_point() else moved
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _overload(qualname: str) -> Any:
    import torch

    namespace, _, rest = qualname.partition("::")
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else text
    return f"{type(exc).__name__}: {first}"[:300]


def _gradcheck(overload: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """gradcheck over the sample's inputs that require grad; ``None`` when it passes."""
    import torch

    flat = list(args) + list(kwargs.values())
    grad_positions = [i for i, a in enumerate(flat)
                      if isinstance(a, torch.Tensor) and a.requires_grad]
    if not grad_positions:
        return "no input requires grad"
    names = list(kwargs)

    def call(*tensors: Any) -> Any:
        values = list(flat)
        for pos, t in zip(grad_positions, tensors):
            values[pos] = t
        return overload(*values[:len(args)], **dict(zip(names, values[len(args):])))

    torch.autograd.gradcheck(call, tuple(flat[i] for i in grad_positions))
    return None


def _bar(done: int, total: int, width: int = 20) -> str:
    """A progress bar that works in logs too: one line per step, no terminal control codes."""
    filled = round(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _outcome(outcome: Any) -> tuple[str, str]:
    """An opcheck report entry as ``(status, message)``."""
    if outcome == "SUCCESS":
        return "ok", ""
    if isinstance(outcome, BaseException):
        return "fail", _first_line(outcome)
    return "skip", str(outcome)


def _check_op(registry: Registry, op: OpPlan, machine: dict[str, str],
              say: Callable[[str], None], prefix: str) -> list[CheckResult]:
    """Every check of one op on every device of ``machine`` it has an active kernel for.

    ``say(prefix + ...)`` reports progress: one line per device, or why nothing ran.
    """
    name = op.op.qualname
    record = partial(CheckResult, op=name,
                     distribution=op.op.origin.dist if op.op.origin else None)
    if name not in registry.op_names:
        problem = next((str(p) for p in registry.problems if p.op == name
                        or (op.op.origin and op.op.origin in p.culprits)), "")
        say(f"{prefix}: FAIL (not registered)")
        return [record(device="-", check="registered", status="fail",
                       message=f"not registered: {problem or 'see opregistry doctor'}")]
    # the sample module and function are the op author's code: contained
    outcome = guard.run(samples_of, op, origin=op.op.origin or Origin(distribution="?", version="?"),
                        what="producing sample inputs")
    if outcome.error is not None:
        say(f"{prefix}: FAIL (sample inputs)")
        return [record(device="-", check="samples", status="fail",
                       message=f"{op.op.samples}: {_first_line(outcome.error)}")]
    samples = outcome.result
    if not samples:
        say(f"{prefix}: skipped (no samples)")
        return [record(device="-", check="samples", status="skip",
                       message="no sample inputs declared (samples=)")]
    op_devices = devices_for(op, machine)
    if not op_devices:
        say(f"{prefix}: skipped (no device)")
        return [record(device="-", check="samples", status="skip",
                       message="no active device kernel on this machine")]
    overload = _overload(name)
    autograd = op.kernel("Autograd")
    has_autograd = autograd is not None and autograd.status == "active"
    results: list[CheckResult] = []
    for device in op_devices:
        found: list[CheckResult] = []
        for i, (args, kwargs) in enumerate(samples):
            args, kwargs = _to_device(args, machine[device]), _to_device(kwargs, machine[device])
            found += _check_sample(overload, args, kwargs, has_autograd,
                                   partial(record, device=device, sample=i))
        failed = sum(1 for r in found if r.status == "fail")
        say(f"{prefix} on {device}: {len(samples)} sample(s), " + (f"{failed} FAILED" if failed else "ok"))
        results += found
    return results


def _check_sample(overload: Any, args: Any, kwargs: Any, has_autograd: bool,
                  record: Callable[..., CheckResult]) -> list[CheckResult]:
    """opcheck (and gradcheck, with an autograd formula) of one sample on one device.

    The kernels run here: what they raise -- a ``SystemExit`` included -- is a
    failed check, never the end of the run (:mod:`opregistry.containment`).
    """
    import torch

    report, exc = contain(lambda: torch.library.opcheck(overload, args, kwargs,
                                                        raise_exception=False))
    if exc is not None:
        return [record(check=OPCHECK_UTILS[0], status="fail", message=_first_line(exc))]
    found = []
    for util in OPCHECK_UTILS:
        if report.get(util) is not None:
            status, message = _outcome(report[util])
            found.append(record(check=util, status=status, message=message))
    if has_autograd:
        why_not, exc = contain(_gradcheck, overload, args, kwargs)
        if exc is not None:
            status, message = "fail", _first_line(exc)
        else:
            status, message = ("skip", why_not) if why_not else ("ok", "")
        found.append(record(check=GRADCHECK, status=status, message=message))
    return found


def adopted_names(adopted: Any) -> list[str]:
    """Every op of ``adopted`` its files name (kernel-only ops of its namespaces included), and
    every op its adapter declares samples for."""
    mine = set(adopted.namespaces)
    names = {reg.op for reg in adopted.ops()}
    names |= {k.op for k in adopted.kernels if k.op and k.op.split("::")[0] in mine}
    return sorted(names | set(adopted.samples))


def names_adopted(target: str, op: str) -> bool:
    """Whether ``target`` (a namespace, ``ns::op`` or ``ns::op.overload``) names ``op``."""
    return target in (op, op.split(".")[0], op.split("::")[0])


def _adopted(registry: Registry, targets: Iterable[str]) -> list[tuple[Any, str, str | None]]:
    """``(adopted, op, samples or None)`` of each adopted op that ``targets`` name; with no
    targets, those of every adopted distribution and those with samples of the others."""
    wanted = list(targets)
    found = []
    for adopted in registry.plan.adoptions:
        for op in adopted_names(adopted):
            ref = adopted.samples.get(op)
            if (any(names_adopted(t, op) for t in wanted) if wanted
                    else adopted.active or ref is not None):
                found.append((adopted, op, ref))
    return found


def _adapter(adopted: Any) -> Origin | None:
    """Who declared the samples of ``adopted``: its adapter (``Adoption(samples=...)``)."""
    return adopted.declared_by[0] if adopted.declared_by else None


def _check_adopted(adopted: Any, op: str, ref: str | None, machine: dict[str, str],
                   say: Callable[[str], None], prefix: str) -> list[CheckResult]:
    """opcheck of an adopted op over its adapter's sample inputs, on CPU and the machine's
    accelerator (its kernels are the package's: none is known to be absent).

    An op without samples is skipped (nothing of the package is imported for it); a failure
    of the samples -- the function, or an op the package does not register -- is the
    adapter's that declared them.
    """
    record = partial(CheckResult, op=op, distribution=adopted.distribution.text)
    adapter = _adapter(adopted)
    if ref is None:
        say(f"{prefix}: skipped (adopted, no samples)")
        why = (f"no sample inputs: declare them in an adapter, Adoption(samples={{{op!r}: "
               f"'module:function'}}) (docs: ecosystem, 'Declared by an adapter')"
               if adopted.active else f"not adopted ({adopted.reason}), no sample inputs")
        return [record(device="-", check="samples", status="skip",
                       message=f"adopted from {adopted.distribution.text}; {why}")]
    declared = (f"samples declared by {adapter}" if adapter
                else "samples declared by an adapter")
    origin = adapter or Origin(distribution=adopted.name, version=adopted.distribution.version)
    overload, exc = contain(_overload, op)  # its first touch: adoption imports the package
    if exc is not None:
        say(f"{prefix}: FAIL (not in torch)")
        known = op in {reg.op for reg in adopted.ops()} | {k.op for k in adopted.kernels}
        if known or adapter is None:  # the package's own op: its import did not register it
            return [record(device="-", check="registered", status="fail",
                           message=f"{adopted.distribution.text} did not register it: "
                                   f"{_first_line(exc)}")]
        return [record(device="-", check="registered", status="fail", distribution=str(adapter),
                       message=f"not an op of {adopted.distribution.text} ({declared}: "
                               f"name one of its ops in Adoption(samples=...)): "
                               f"{_first_line(exc)}")]
    outcome = guard.run(_samples, ref, op, origin=origin, what="producing sample inputs")
    if outcome.error is not None:
        say(f"{prefix}: FAIL (sample inputs)")
        return [record(device="-", check="samples", status="fail",
                       distribution=str(adapter) if adapter else adopted.distribution.text,
                       message=f"{ref} ({declared}): {_first_line(outcome.error)}")]
    results: list[CheckResult] = []
    for device, torch_device in machine.items():
        for i, (args, kwargs) in enumerate(outcome.result):
            args, kwargs = _to_device(args, torch_device), _to_device(kwargs, torch_device)
            results += _check_sample(overload, args, kwargs, False,
                                     partial(record, device=device, sample=i))
    failed = sum(1 for r in results if r.status == "fail")
    say(f"{prefix} (adopted): {len(outcome.result)} sample(s), "
        + (f"{failed} FAILED" if failed else "ok"))
    return results


def run_checks(registry: Registry, targets: Iterable[str] = (), *,
               devices: Iterable[str] | None = None,
               progress: Callable[[str], None] | None = None) -> tuple[list[CheckResult], list[str]]:
    """Check the selected ops of ``registry``, adopted ones with sample inputs included;
    returns the results and the unknown targets."""
    selected, unknown = select_ops(registry.plan.ops, targets)
    adopted = _adopted(registry, targets)
    unknown = [t for t in unknown if not _adopted(registry, [t])]
    if unknown:  # a typo in a target: say so at once rather than after minutes of checks
        return [], unknown
    available = _available_devices()
    machine = {d: available.get(d, d) for d in devices} if devices is not None else available
    say = progress or (lambda text: None)
    results: list[CheckResult] = []
    total = len(selected) + len(adopted)
    for index, op in enumerate(selected, 1):
        prefix = f"{_bar(index, total)} {index}/{total} {op.op.qualname}"
        results += _check_op(registry, op, machine, say, prefix)
    for index, (adoption, name, ref) in enumerate(adopted, len(selected) + 1):
        results += _check_adopted(adoption, name, ref, machine, say,
                                  f"{_bar(index, total)} {index}/{total} {name}")
    return results, unknown
