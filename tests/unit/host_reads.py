"""Counting host reads of tensor values: what makes the host wait for a device.

``.item()``, ``float()``, ``int()`` and ``bool()`` of a tensor go through ``aten._local_scalar_dense``, which
a ``TorchDispatchMode`` sees; ``Tensor.tolist`` copies without dispatching an operator, so it is wrapped
while the mode is on. On the CPU nothing waits, but the count is the same as on a GPU, where each read
would be a device synchronisation."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReadError(AssertionError):
    """A host read where none may happen (inside a captured update)."""


class HostReads(TorchDispatchMode):
    """``with HostReads() as reads: ...`` then ``reads.count``; ``forbid=True`` raises at the first read."""

    def __init__(self, *, forbid: bool = False) -> None:
        super().__init__()
        self.forbid = forbid
        self.count = 0
        self.what: list[str] = []
        self._tolist: Any = None

    def _read(self, what: str) -> None:
        self.count += 1
        self.what.append(what)
        if self.forbid:
            raise HostReadError(f"a host read ({what}) inside a region that must not read the device")

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self._read("item")
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostReads:
        original = self._tolist = torch.Tensor.tolist
        mode = self

        def counted_tolist(tensor: torch.Tensor) -> Any:
            mode._read("tolist")
            return original(tensor)

        torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]
