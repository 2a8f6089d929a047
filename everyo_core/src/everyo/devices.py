"""Devices: EveryO computes on the CPU, so ``"cpu"`` is the one device a PyTorch-style
``.to(device)`` accepts; any other device is refused by name."""

from __future__ import annotations

from everyo.errors import EveryOError

_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "meta", "xla", "hip", "npu")


def is_device(value) -> bool:
    """True for a device name such as ``"cpu"``, ``"cuda:0"`` (not a dtype name).

    Example:
        >>> is_device("cpu"), is_device("cuda:1"), is_device("float32")
        (True, True, False)
    """
    return isinstance(value, str) and value.split(":")[0] in _DEVICE_TYPES


def check_device(device, where: str) -> None:
    """Accept the CPU (``"cpu"``, ``"cpu:0"``); refuse any other device naming it.

    Example:
        >>> check_device("cpu", "Module.to")
    """
    if device in ("cpu", "cpu:0"):
        return
    raise EveryOError(f"{where}: EveryO computes on the CPU only, got device {device!r}; "
                      f"use 'cpu' (or leave the device out)")
