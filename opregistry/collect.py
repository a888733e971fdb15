"""Stage 2, collect: call the hooks of every plugin and gather declarations.

Plugins are registered with a :class:`pluggy.PluginManager` that validates
them against :mod:`opregistry.hookspecs`.  Each plugin's hook
implementations are then called one plugin at a time, so a plugin that
raises, or returns something that is not a declaration, is reported as a
problem of its distribution and the others are still collected.  Every
record is stamped with the :class:`~opregistry.model.Origin` of the plugin
that returned it.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from typing import Any, Callable, Iterable

import attrs
import pluggy
from attrs import field, frozen

from . import guard, hookspecs
from .adoption import Adoption
from .ownership import (Owners, attributed, change_culprit, foreign_hook, is_op_library, not_owned,
                        state_problem)
from .seal import Seal
from .discovery import BACKENDS_GROUP, OPS_GROUP, load_problem
from .containment import describe
from .errors import DOCS_URL, PluginLoadError, PluginValidationError
from .logs import get_logger
from .model import (
    Backend,
    Declarations,
    Discovered,
    Kernel,
    Namespace,
    OpDef,
    Origin,
    Plugin,
    Problem,
    Skipped,
    evolve_unchecked,
    source_of,
)

__all__ = ["Collected", "collect", "make_plugin_manager", "HOOK_GROUPS", "MATERIALIZE_ARGS"]

log = get_logger()

OP_HOOKS: dict[str, type] = {
    "opregistry_namespaces": Namespace,
    "opregistry_ops": OpDef,
    "opregistry_kernels": Kernel,
    "opregistry_adoptions": Adoption,
}
BACKEND_HOOKS: dict[str, type] = {"opregistry_backends": Backend}
PER_BACKEND_HOOKS = ("opregistry_backend_available", "opregistry_materialize_kernel")
HOOK_GROUPS: dict[str, str] = {
    **{name: OPS_GROUP for name in OP_HOOKS},
    **{name: BACKENDS_GROUP for name in (*BACKEND_HOOKS, *PER_BACKEND_HOOKS)},
}


@frozen
class Collected:
    """Declarations, plus the backends' materialize hooks (not data: callables)."""

    declarations: Declarations
    materializers: dict[tuple[str, str], Callable[..., Any]] = field(eq=False, repr=False)


_ABSENT = object()


class _PluginManager(pluggy.PluginManager):
    """Takes ``opregistry_*`` functions as hook implementations without the marker.

    It also remembers which hooks the plugin being registered implements
    (:attr:`parsed`), so that finding a plugin's implementations costs as
    much for the 1,000th plugin as for the first: pluggy's own lookup
    (``get_hookcallers``) scans every implementation of every plugin.
    """

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        #: the hook names taken from :attr:`parsed_from`, the plugin of the last ``register()``
        self.parsed: list[str] = []
        self.parsed_from: Any = None
        #: (class, name): no hook implementation on an instance of the class that does not
        #: hold the name itself -- pluggy's answer there is the class's alone
        self._not_hooks: set[tuple[type, str]] = set()

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        self.parsed, self.parsed_from = [], plugin
        return super().register(plugin, name)

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        if name.startswith("__"):
            # pluggy inspects every name in dir(plugin) with inspect.getattr_static;
            # dunders are never hooks, and skipping them halves the cost of
            # registering an OpLibrary (it adds up at 1,000 op packages)
            return None
        # pluggy looks every name up with inspect.getattr_static, ~10 us each: 1,000
        # OpLibrary objects ask the same ~20 questions of one class.  An answer that the
        # class alone decides is remembered, for this manager's life, when it is "no"
        per_class = _class_decides(plugin, name)
        if per_class and (type(plugin), name) in self._not_hooks:
            return None
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("opregistry_"):
            method = getattr(plugin, name, None)
            if inspect.isroutine(method):
                opts = {}
            per_class = False  # getattr may run the instance's own code: asked every time
        if opts is not None:
            self.parsed.append(opts.get("specname") or name)
        elif per_class:
            self._not_hooks.add((type(plugin), name))
        return opts


def _class_decides(plugin: Any, name: str) -> bool:
    """Whether pluggy's lookup of ``name`` on ``plugin`` reads its class only.

    True for an instance (not a class, not a module) that does not hold
    ``name`` itself (not in its ``__dict__``, not a ``__slots__`` slot), and
    whose class holds it as a function, a static or class method, or a value
    that is no descriptor: what pluggy finds there does not depend on the
    instance, whether it looks with ``getattr_static`` (pluggy >= 1.6) or
    with ``getattr`` (older: a property, a ``__getattr__`` or a custom
    ``__getattribute__`` would run the instance's code, so those are asked
    every time).
    """
    if isinstance(plugin, (type, types.ModuleType)):
        return False
    cls = type(plugin)
    if cls.__getattribute__ is not object.__getattribute__:
        return False
    try:
        hash(cls)  # a metaclass may define __eq__ without __hash__: nothing to remember by
    except TypeError:
        return False
    try:
        own = object.__getattribute__(plugin, "__dict__")
    except AttributeError:
        own = {}
    if isinstance(own, dict) and name in own:
        return False
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _ABSENT)
        if found is not _ABSENT:
            return (isinstance(found, (types.FunctionType, staticmethod, classmethod))
                    or not hasattr(type(found), "__get__"))
    return False  # only a __getattr__ could answer: the instance's code


def _hookimpls(pm: pluggy.PluginManager, obj: Any) -> dict[str, list[Any]]:
    """The hook implementations of the plugin ``obj``, by hook name.

    Each list is in pluggy's order (``get_hookimpls()``).  For the plugin a
    :class:`_PluginManager` registered last, the implementations are found from the end of
    each hook's list, where pluggy has just put them: collecting 1,000
    distributions stays linear (pluggy's ``get_hookcallers`` made it
    quadratic, ~0.5 s of 1,000 op packages' collection).
    """
    if not isinstance(pm, _PluginManager) or pm.parsed_from is not obj:
        # another plugin manager, or not the plugin registered last: pluggy's lookup
        return {caller.name: [i for i in caller.get_hookimpls() if i.plugin is obj]
                for caller in pm.get_hookcallers(obj) or ()}
    wanted: dict[str, int] = {}
    for hook_name in pm.parsed:
        wanted[hook_name] = wanted.get(hook_name, 0) + 1
    found: dict[str, list[Any]] = {}
    for hook_name, count in wanted.items():
        caller = getattr(pm.hook, hook_name, None)  # none: the plugin was not registered
        mine = []
        for impl in reversed(caller.get_hookimpls() if caller is not None else ()):
            if impl.plugin is obj:
                mine.append(impl)
                if len(mine) == count:
                    break
        if mine:
            found[hook_name] = mine[::-1]
    return found


def make_plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with opregistry's hook specifications and no plugins."""
    pm = _PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _validation_problem(origin: Origin, message: str, source: str | None = None,
                        cause: BaseException | None = None) -> Problem:
    error = PluginValidationError(f"{origin}: {message}", origin=origin)
    error.__cause__ = cause
    return Problem(
        code="plugin-invalid",
        message=f"{origin}: {message}",
        hint=f"fix the hook implementations of {origin.distribution} (the hooks and their "
             f"arguments: {DOCS_URL}hooks/)",
        culprits=(origin,),
        source=source,
        error=error,
    )


def _hookimpl_source(obj: Any, message: str) -> str | None:
    """file:line of the hook implementation a pluggy validation message is about."""
    match = re.search(r"for hook '(\w+)'", message)
    return source_of(getattr(obj, match.group(1), None) if match else None)


def _register(pm: pluggy.PluginManager, plugin: Plugin) -> Problem | dict[str, list[Any]]:
    """Register ``plugin``: its hook implementations by hook name, or its problem."""
    origin = plugin.origin
    name = f"{origin.group}:{origin.distribution}:{origin.entry_point}"
    try:
        pm.register(plugin.obj, name=name)
    except pluggy.PluginValidationError as exc:
        return _validation_problem(origin, str(exc), _hookimpl_source(plugin.obj, str(exc)), exc)
    except ValueError as exc:  # the same object or name registered twice
        return _validation_problem(origin, f"cannot be registered: {exc}", cause=exc)
    impls = _hookimpls(pm, plugin.obj)
    for caller in (getattr(pm.hook, hook_name) for hook_name in impls):
        if caller.spec is None:
            import difflib  # here: only a mistake needs it

            close = difflib.get_close_matches(caller.name, HOOK_GROUPS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            pm.unregister(plugin.obj)
            return _validation_problem(origin, f"implements unknown hook {caller.name}{hint}",
                                       source_of(getattr(plugin.obj, caller.name, None)))
        if HOOK_GROUPS[caller.name] != origin.group:
            pm.unregister(plugin.obj)
            return _validation_problem(
                origin,
                f"implements {caller.name}, a hook of {HOOK_GROUPS[caller.name]}, but its "
                f"entry point is in {origin.group}",
                source_of(getattr(plugin.obj, caller.name, None)),
            )
    return impls


def _call(impl: Any, **kwargs: Any) -> Any:
    """Call a hook implementation with the arguments it declares (pluggy's rule)."""
    return impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})


def _hook_problem(origin: Origin, hook_name: str, exc: BaseException) -> Problem:
    problem = load_problem(origin, exc)
    message = f"{origin}: {hook_name}() raised {describe(exc)}"
    error = PluginLoadError(message, origin=origin)
    error.__cause__ = exc
    return attrs.evolve(
        problem,
        code="plugin-hook-error" if problem.code == "plugin-import-error" else problem.code,
        message=message,
        error=error,
    )


def _records(
    origin: Origin, hook_name: str, result: Any, record_type: type, function: Any = None
) -> tuple[list[Any], Problem | None]:
    if result is None:
        return [], None
    records = []
    for item in result:
        # the exact type: a subclass could run its own code inside the resolver
        if type(item) is not record_type:
            return [], _validation_problem(
                origin,
                f"{hook_name}() returned a {type(item).__name__}; it must return "
                f"{record_type.__name__} records",
                source_of(function),
            )
        records.append(_stamped(item, origin))
    return records, None


def _stamped(item: Any, origin: Origin) -> Any:
    """``item`` with ``origin`` set: ``attrs.evolve(item, origin=origin)``, at a fraction of the cost.

    ``item`` is of the exact record type and frozen, so its converters and
    validators ran when the plugin built it, and ``origin`` has none and
    takes no part in equality or hashing (``eq=False``).  A record no
    distribution has claimed yet (the common case: an ``OpLibrary``'s own
    records) is stamped in place, and one already stamped with this origin
    (collected again: ``reload=True``) is returned as it is: one object per
    record instead of two, which the interpreter must otherwise keep, scan
    and free (five records per op; 10,000 ops leave ~650,000 objects behind,
    docs/performance.md).  A record another distribution claimed first is
    copied, so each keeps its own origin.
    """
    current = item.origin
    if current is None:
        object.__setattr__(item, "origin", origin)
        return item
    if current == origin:
        return item
    return evolve_unchecked(item, origin=origin)


def collect(discovered: Discovered, pm: pluggy.PluginManager | None = None) -> Collected:
    """Register ``discovered`` plugins and gather their declarations."""
    pm = pm or make_plugin_manager()
    problems = list(discovered.problems)
    skipped = list(discovered.skipped)
    gathered: dict[type, list[Any]] = {t: [] for t in (Namespace, OpDef, Kernel, Backend, Adoption)}
    available: dict[str, bool] = {}
    materializers: dict[tuple[str, str], Callable[..., Any]] = {}
    distributions: list[Origin] = []
    implemented: dict[Origin, tuple[str, ...]] = {}
    # with torch imported, what a hook registers with torch by itself is watched
    watched: frozenset[str] | None = frozenset() if "torch" in sys.modules else None

    seal = Seal()  # opregistry's own state, sealed while plugins' hooks run
    owners = Owners(discovered.plugins)
    for plugin in discovered.plugins:
        origin = plugin.origin
        with guard.running(origin):
            outcome = _collect_one(pm, plugin, owners, watched)
        # an OpLibrary whose hooks are its class's own runs no third-party code here
        changes = [] if _only_ours(plugin) else seal.check()
        if changes:  # put back already; see opregistry.seal
            problems.append(state_problem(change_culprit(changes, origin, owners), changes,
                                          f"opregistry called the hooks of {origin.dist}"))
        if isinstance(outcome, Problem):
            problems.append(outcome)
            skipped.append(Skipped(origin, outcome.message))
            continue
        own, impls, found, backend_state = outcome
        problems.extend(found)
        available.update(backend_state[0])
        materializers.update(backend_state[1])
        for record_type, records in own.items():
            gathered[record_type].extend(records)
        distributions.append(origin)
        implemented[origin] = tuple(sorted(impls))  # only hooks with an implementation

    declarations = Declarations(
        namespaces=gathered[Namespace],
        ops=gathered[OpDef],
        kernels=gathered[Kernel],
        backends=gathered[Backend],
        available=available,
        distributions=distributions,
        skipped=skipped,
        problems=problems,
        hooks=implemented, adoptions=[*discovered.adoptions, *gathered[Adoption]],
    )
    log.debug(
        "collected",
        plugins=len(distributions),
        ops=len(declarations.ops),
        kernels=len(declarations.kernels),
        problems=len(problems),
    )
    return Collected(declarations, materializers)


def _only_ours(plugin: Plugin) -> bool:
    """Whether collecting ``plugin`` runs only opregistry's code: an ``OpLibrary`` with no
    hook of its own put on the instance (pluggy reads it with ``getattr_static``)."""
    obj = plugin.obj
    return is_op_library(obj) and not any(name.startswith("opregistry_") for name in vars(obj))


_Outcome = tuple[dict[type, list[Any]], dict[str, list[Any]], list[Problem],
                 tuple[dict[str, bool], dict[tuple[str, str], Callable[..., Any]]]]


def _collect_one(pm: pluggy.PluginManager, plugin: Plugin, owners: Owners,
                 watched: frozenset[str] | None) -> Problem | _Outcome:
    """One plugin's records (what it owns), hooks, problems and backend state; or its problem."""
    origin = plugin.origin
    # pluggy reads the plugin's attributes (a __getattr__ of the plugin's runs)
    registered = guard.run(_register, pm, plugin, origin=origin, what="registering its hooks")
    impls = registered.result if registered.error is None else _hook_problem(
        origin, "registering its hooks: pluggy", registered.error)
    if isinstance(impls, Problem):
        return impls
    hooks = OP_HOOKS if origin.group == OPS_GROUP else BACKEND_HOOKS
    own: dict[type, list[Any]] = {t: [] for t in (Namespace, OpDef, Kernel, Backend, Adoption)}
    problems: list[Problem] = []
    state: tuple[dict[str, bool], dict[tuple[str, str], Callable[..., Any]]] = ({}, {})
    foreign: dict[Origin, list[Any]] = {}
    try:
        for hook_name, record_type in hooks.items():
            for impl in impls.get(hook_name, ()):
                impl = _owned_hook(plugin, hook_name, impl, owners, problems)
                if impl is None:
                    continue
                result, warnings = _run_hook(impl, origin, hook_name, watched, _as_list)
                problems.extend(warnings)
                records, problem = _records(origin, hook_name, result, record_type,
                                            impl.function)
                if problem is not None:
                    raise _Failed(problem)
                own[record_type].extend(_owned_records(plugin, records, owners, foreign))
        if origin.group == BACKENDS_GROUP:
            state = _backend_state(impls, plugin, own[Backend], watched, problems)
    except _Failed as failed:
        return failed.problem
    return own, impls, problems + _not_owned_problems(plugin, foreign), state


def _owned_hook(plugin: Plugin, hook_name: str, impl: Any, owners: Owners,
                problems: list[Problem]) -> Any:
    """``impl``, or -- when another distribution's code put it there -- the plugin's own.

    An ``OpLibrary``'s own hook is its class's method, whatever was put on the
    instance; a plugin of another kind has no other to fall back to (``None``).
    """
    culprit = foreign_hook(plugin, impl.function, owners)
    if culprit is None:
        return impl
    problems.append(not_owned(culprit, plugin.origin, f"its own {hook_name}() on it",
                              source_of(impl.function)))
    if is_op_library(plugin.obj):
        method = getattr(type(plugin.obj), hook_name).__get__(plugin.obj)
        return types.SimpleNamespace(function=method, argnames=())
    return None


def _owned_records(plugin: Plugin, records: list[Any], owners: Owners,
                   foreign: dict[Origin, list[Any]]) -> list[Any]:
    """``records`` less those another distribution's code declared (into ``foreign``, by author)."""
    author_of = attributed(plugin, owners)
    if author_of is None:
        return records  # every record declared where and while the library was made
    kept = []
    for record in records:
        author, replaced = author_of(record)
        if author.distribution == plugin.origin.distribution:
            kept.append(record)
            continue
        if replaced is not None:  # what the plugin declared before the change: its own
            kept.append(_stamped(replaced, plugin.origin))
        foreign.setdefault(author, []).append(record)
    return kept


def _not_owned_problems(plugin: Plugin, foreign: dict[Origin, list[Any]]) -> list[Problem]:
    """One problem per distribution that declared through ``plugin``'s library."""
    return [not_owned(author, plugin.origin, ", ".join(map(_describe, theirs)),
                      next((r.source for r in theirs if r.source), None))
            for author, theirs in foreign.items()]


def _describe(record: Any) -> str:
    if isinstance(record, Kernel):
        return f"a {record.key} kernel for {record.op}"
    if isinstance(record, OpDef):
        return f"the op {record.qualname}"
    return f"{type(record).__name__} {getattr(record, 'name', '')}"


class _Failed(Exception):
    def __init__(self, problem: Problem) -> None:
        self.problem = problem


def _as_list(result: Any) -> list[Any]:
    """A hook's records as a list: iterating a plugin's generator runs plugin code."""
    if result is None:
        return []
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        return [result]
    return list(result)


def _answer(result: Any) -> bool | None:
    """A backend's availability: ``bool()`` of a plugin's object runs plugin code."""
    return None if result is None else bool(result)


def _run_hook(impl: Any, origin: Origin, hook_name: str, watched: frozenset[str] | None,
              evaluate: Callable[[Any], Any], **kwargs: Any) -> tuple[Any, list[Problem]]:
    """Call a plugin's hook contained (:mod:`opregistry.guard`); raise :class:`_Failed` on failure.

    Returns the evaluated result and the warnings about registrations the
    policy allowed; an exception, or an unplanned registration, fails the plugin.
    """
    outcome = guard.run(lambda: evaluate(_call(impl, **kwargs)), origin=origin,
                        what=f"calling {hook_name}()", protected=watched)
    if outcome.error is not None:
        raise _Failed(_hook_problem(origin, hook_name, outcome.error))
    errors = [p for p in outcome.problems if p.severity == "error"]
    if errors:
        raise _Failed(errors[0])
    return outcome.result, list(outcome.problems)


def _backend_state(
    impls: dict[str, list[Any]], plugin: Plugin, backends: list[Backend],
    watched: frozenset[str] | None, problems: list[Problem],
) -> tuple[dict[str, bool], dict[tuple[str, str], Callable[..., Any]]]:
    origin = plugin.origin
    available: dict[str, bool] = {}
    materializers: dict[tuple[str, str], Callable[..., Any]] = {}
    materialize = impls.get("opregistry_materialize_kernel", [])
    if backends and not materialize:
        raise _Failed(
            _validation_problem(
                origin, "declares a backend but does not implement opregistry_materialize_kernel"
            )
        )
    for backend in backends:
        answer = None
        for impl in impls.get("opregistry_backend_available", ()):
            answer, warnings = _run_hook(impl, origin, "opregistry_backend_available", watched,
                                         _answer, backend=backend)
            problems.extend(warnings)
            if answer is not None:
                break
        available[backend.name] = True if answer is None else answer
        # keyed by distribution too: a left-out distribution may reuse a backend's name
        materializers[(origin.distribution, backend.name)] = _materializer(materialize[0])
    return available, materializers


#: the arguments of ``opregistry_materialize_kernel``, in the order the materializer passes them
MATERIALIZE_ARGS = ("library", "op", "kernel", "payload", "fn")


def _materializer(impl: Any) -> Callable[..., Any]:
    """``impl``'s ``opregistry_materialize_kernel``, called with the arguments it declares.

    Called once per kernel (thousands at ``import torch``), positionally with
    :data:`MATERIALIZE_ARGS`: the arguments ``impl`` takes, in its own order,
    are worked out here, once, as pluggy does, and picked from them.
    """
    function = impl.function
    order = tuple(MATERIALIZE_ARGS.index(name) for name in impl.argnames)
    if order == tuple(range(len(order))):  # a prefix, the usual case: no reordering
        width = len(order)

        def materialize(*args: Any) -> Any:
            return function(*args[:width])
    else:
        def materialize(*args: Any) -> Any:
            return function(*[args[i] for i in order])

    return materialize
