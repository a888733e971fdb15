"""Every problem code opregistry reports, in one table: its severity, whether it leaves a distribution out, its page.

A :class:`~opregistry.model.Problem` carries a code from :data:`CODES`; the
table says what the code means for the registry:

* ``severities`` -- what a problem of that code can be, the first its
  default: ``error`` (``opregistry doctor`` exits 1, strict mode raises),
  ``warning`` or ``info``;
* ``leaves_out`` -- whether the distributions a problem of that code
  names as culprits are left out whole (rule 9).  Some errors leave nobody
  out: a configuration mistake, an op that can run on no device here;
* ``anchor`` -- the section of the documentation that explains it (every
  code is a heading of ``docs/problems.md``, which a test compares with this
  table).

A registration kind defined outside the core may report codes of its own
(:class:`~opregistry.kinds.Misfit`); those are errors that leave their
distribution out, documented by the kind's distribution.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = ["Severity", "Code", "CODES", "code_of", "PAGE"]

#: ``error`` makes ``doctor`` fail and strict mode raise; ``warning`` and ``info`` are reported
Severity = Literal["error", "warning", "info"]

#: the documentation page with a section per code
PAGE = "problems"


class Code(NamedTuple):
    """One problem code: what its problems are, and where it is explained."""

    name: str
    severities: tuple[Severity, ...]
    leaves_out: bool
    summary: str

    @property
    def severity(self) -> Severity:
        """The default severity."""
        return self.severities[0]

    @property
    def anchor(self) -> str:
        """``problems/#kernel-conflict``: the section of the documentation site."""
        return f"{PAGE}/#{self.name}"


_E, _W, _I = ("error",), ("warning",), ("info",)


def _codes(*rows: tuple[str, tuple[Severity, ...], bool, str]) -> dict[str, Code]:
    return {name: Code(name, severities, leaves, summary)
            for name, severities, leaves, summary in rows}


CODES: dict[str, Code] = _codes(
    # -- configuration and discovery ------------------------------------------------------
    ("config-invalid", _E, False, "a setting cannot be read; nothing is registered"),
    ("config-unknown-distribution", _E, False,
     "an allow- or block-list names a distribution that is not installed"),
    ("config-unknown-variable", _W, False, "an OPREGISTRY_* variable opregistry does not read"),
    ("config-backend-invalid", _E, False,
     "a backend choice names a distribution that declares no backend for the key"),
    ("distribution-duplicate", _E, True, "a distribution is installed twice on sys.path"),
    ("entry-point-duplicate", _E, True,
     "a distribution declares one entry-point name twice in a group"),
    ("declaration-invalid", _E, True, "a declaration is refused when it is made"),
    ("plugin-missing-module", _E, True, "an entry point names a module that does not exist"),
    ("plugin-missing-attribute", _E, True,
     "an entry point names an attribute its module does not define"),
    ("plugin-import-error", _E, True, "a plugin module raised while it was imported"),
    ("plugin-invalid", _E, True, "a plugin's hook implementations do not match the hooks"),
    ("declaration-not-owned", _E, True,
     "a declaration or hook made through another distribution's library"),
    ("opregistry-state-changed", _E, True,
     "a plugin changed opregistry's own modules or classes: refused or undone"),
    ("plugin-hook-error", _E, True, "a plugin's hook raised"),
    ("plugin-registered-outside-plan", _E, True,
     "a plugin registered with torch by itself, outside the plan; undone where torch allows"),
    ("plugin-registration-allowed", _W, False,
     "a plugin registered with torch by itself and the override policy allows it"),
    ("plugin-replaced-torch-kernel", _E, True,
     "a plugin replaced a kernel of a protected op by itself; torch cannot take it back"),
    ("lock-unreadable", _E, False, "locked mode: the lockfile cannot be used; nothing loads"),
    ("lock-mismatch", _E, True, "locked mode: an installed distribution differs from the lock"),
    ("lock-missing", _W, False, "locked mode: the lock names a distribution not installed"),
    ("cache-declarations-differ", _E, False,
     "a distribution's declarations differ from the plan cache's for the same inputs"),
    # -- backends -------------------------------------------------------------------------
    ("backend-conflict", _E, True, "two distributions declare a backend of the same name"),
    ("backend-shadowed", ("warning", "info"), False,
     "two backends declare one dispatch key; one serves it"),
    # -- namespaces -----------------------------------------------------------------------
    ("namespace-invalid", _E, True, "a namespace torch cannot parse or reach"),
    ("namespace-reserved", _E, True, "a namespace that belongs to torch"),
    ("namespace-conflict", _E, True, "two distributions DEF one namespace"),
    ("namespace-held-by-torch", _E, True,
     "a DEF of a namespace torch's dispatcher already holds"),
    ("namespace-held-by-package", _E, True,
     "a DEF of a namespace a package registers in with torch.library directly"),
    ("namespace-closed", _E, True, "a FRAGMENT of a namespace its owner closed"),
    # -- ops ------------------------------------------------------------------------------
    ("op-namespace-undeclared", _E, True, "an op in a namespace its distribution did not declare"),
    ("op-name-invalid", _E, True, "an op name torch cannot parse or reach"),
    ("schema-invalid", _E, True, "a schema torch would refuse, or that opregistry refuses"),
    ("schema-type-needs-newer-torch", _E, True,
     "a schema type the installed torch's parser does not know"),
    ("schema-type-gone-from-torch", _E, True,
     "a schema type the installed torch's parser no longer knows"),
    ("schema-dtype-needs-newer-torch", _E, True,
     "a dtype name in a default that the installed torch does not know"),
    ("schema-class-unknown", _E, True, "a custom class type torch has not registered"),
    ("op-held-by-torch", _E, True, "an op torch's dispatcher already defines"),
    ("op-held-by-package", _E, True, "an op a package defines with torch.library directly"),
    ("op-tag-unknown", _E, True, "a tag no supported torch has"),
    ("op-tag-needs-newer-torch", _E, True, "a tag the installed torch does not have"),
    ("op-conflict", _E, True, "two distributions define one op"),
    # -- kernels --------------------------------------------------------------------------
    ("kernel-for-undefined-op", _E, True, "a kernel for an op nobody defines"),
    ("kernel-ref-missing", _E, True,
     "a kernel reference names a module or attribute that does not exist"),
    ("kernel-ref-invalid", _E, True,
     "a kernel reference names what cannot be imported or is not callable"),
    ("kernel-conflict", _E, True, "two kernels for one op and dispatch key"),
    ("kernel-duplicate", _E, True, "one distribution declares two kernels for one op and key"),
    ("kernel-override-denied", _E, True, "an override the policy does not allow"),
    ("kernel-override-undeclared", _E, True,
     "a kernel for a key torch already implements, without override=True"),
    ("kernel-torch-op-denied", _E, True, "a kernel for a torch op the policy does not name"),
    ("kernel-package-op-denied", _E, True,
     "a kernel for an op a package defines with torch.library, the policy not naming it"),
    ("kernel-condition-unsupported", _E, True, "a kernel with conditions for an op torch owns"),
    ("kernel-switch-unknown", _E, False,
     "a kernel switch names no declared op or distribution"),
    ("composite-implicit-mixed", _E, True,
     "other kernels beside a CompositeImplicitAutograd kernel, which torch would bypass"),
    ("autograd-on-mutable-op", _E, True, "an autograd formula for an op that mutates"),
    ("autograd-no-returns", _E, True, "an autograd formula for an op that returns nothing"),
    ("autograd-kwarg-only-tensor", _E, True,
     "an autograd formula for an op with keyword-only tensors"),
    ("vmap-kwarg-only-tensor", _E, True, "a vmap rule for an op with keyword-only tensors"),
    ("autocast-kwarg-only-argument", _E, True,
     "an autocast rule for an op with keyword-only arguments"),
    ("autocast-on-mutable-op", _E, True, "an autocast rule for an op that mutates"),
    ("triton-split", _E, True, "Triton kernels of one op from two distributions"),
    ("torch-dispatch-taken-by-triton", _E, True,
     "a FunctionalTensorMode rule for an op whose Triton kernel registers it"),
    ("triton-missing", _W, False, "a Triton kernel where triton is not installed: inactive"),
    # -- native libraries -----------------------------------------------------------------
    ("native-library-missing", _E, True, "a declared native library cannot be found"),
    ("native-torch-mismatch", _E, True, "a native library built for another torch"),
    ("native-kernel-foreign", _E, True, "a C++ kernel for an op its library does not define"),
    ("native-kernel-displaced", _E, True,
     "a C++ kernel that would not serve; its library is not loaded"),
    ("native-load-failed", _E, True, "a native library raised while it was loaded"),
    ("native-mismatch", _E, True, "a native library registered other ops than declared"),
    ("native-undeclared-registration", _E, True,
     "a native library registered what its distribution does not declare"),
    ("native-library-registers-from-python", _E, True,
     "a native library declared for a package that registers its ops from Python"),
    # -- what a planned op lacks ----------------------------------------------------------
    ("op-no-active-kernel", ("error", "warning"), False,
     "no device kernel is active: an error when a backend is missing, else a warning"),
    ("op-no-fake", _W, False, "no fake kernel: torch.compile and torch.export fail on the op"),
    ("op-fake-inactive", _W, False, "a fake kernel whose backend is not installed"),
    ("op-autograd-inactive", _W, False, "an autograd formula whose backend is not installed"),
    ("op-no-vmap", _I, False, "no vmap rule"),
    # -- adoption (packages that register with torch.library by themselves) ---------------
    ("adoption-unknown-distribution", _E, True,
     "an adapter adopts a distribution that is not installed or registers nothing"),
    ("adoption-of-plugin", _E, True, "an adapter adopts an opregistry plugin"),
    ("adoption-module-not-owned", _E, True,
     "an adoption names a module the adopted distribution did not install"),
    ("adoption-namespace-held", _E, True,
     "an adoption declares a namespace torch, a plugin or another package holds"),
    ("adoption-declared-twice", _W, False,
     "two declarations adopt one distribution and disagree; the first decides"),
    ("adoption-nothing-found", _W, False,
     "an adopted distribution whose namespaces nobody knows: nothing is imported"),
    ("adoption-samples-unknown-op", _W, False,
     "an adapter declares sample inputs for an op the adopted distribution does not define"),
    ("adoption-samples-ref-invalid", _W, False,
     "an adapter's sample-inputs reference names a module or function that cannot be imported"),
    ("adoption-conflict", _E, False,
     "two adopted distributions define one namespace or op: neither is imported"),
    ("adoption-import-failed", _E, False,
     "importing an adopted package (on first touch, or at load) raised"),
    ("kernel-switch-not-applied", _W, False,
     "a switch torch cannot apply (an adopted kernel it cannot take back, a fake kernel or "
     "a rule): the kernel stays"),
    # -- registration and after -----------------------------------------------------------
    ("materialize-failed", _E, True, "torch refused a registration, or a kernel did not import"),
    ("materialize-dependency-failed", _E, True,
     "left out because the op it adds kernels to could not be registered"),
    ("deferred-changes-registry", _E, True,
     "a package that finished importing late would change what is registered"),
    ("kernel-replaced", _E, False,
     "torch no longer dispatches to a kernel opregistry registered (doctor --live)"),
    ("kernel-overrides", _W, False, "an allowed override: whose kernel it replaces"),
)


def code_of(name: str) -> Code | None:
    """The table's entry for ``name``; ``None`` for a code the core does not report."""
    return CODES.get(name)
