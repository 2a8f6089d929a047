"""Devices: EveryO computes on the CPU, so PyTorch's ``.to("cpu")`` is accepted as a no-op and
any other device is refused by name."""

from __future__ import annotations

from everyo.errors import EveryOError

_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hip", "meta", "xla", "ipu", "vulkan")


def is_device(value) -> bool:
    """Whether ``value`` names a device (``"cpu"``, ``"cuda:0"``, a ``torch.device``)."""
    if not isinstance(value, str) and type(value).__name__ != "device":
        return False
    return str(value).split(":")[0] in _DEVICE_TYPES


def check_device(device, what: str) -> None:
    """Accept the CPU (EveryO's only device: a no-op); refuse any other by name."""
    if str(device).split(":")[0] != "cpu":
        raise EveryOError(f"{what}: EveryO computes on the CPU only; device {str(device)!r} is "
                          f"not available (.to('cpu') is accepted and does nothing)")
