"""opregistry-cpu: registers the CPU kernels that op packages declare."""

from opregistry.backend import DeviceBackend

backend = DeviceBackend(
    "cpu", key="CPU", device_type="cpu", description="CPU kernels via Library.impl(..., 'CPU')"
)
