"""opregistry-cpu: registers the CPU kernels that op packages declare.

It also registers the kernels declared for every device
(``CompositeExplicitAutograd``, spelled ``"default"`` too, and
``CompositeImplicitAutograd``): they are registered as a CPU kernel is, with
``Library.impl``, and every op package depends on this backend already.
"""

from opregistry.backend import DeviceBackend

backend = DeviceBackend(
    "cpu", key="CPU", device_type="cpu", composite=True,
    description="CPU kernels via Library.impl(..., 'CPU'); kernels for every device "
                "(CompositeExplicitAutograd, CompositeImplicitAutograd)",
)
