"""Counting host reads of tensor values: what makes the host wait for a device.

Counted where a ``TorchDispatchMode`` sees them: ``.item()``, ``float()``, ``int()``, ``bool()`` of a tensor
(``aten._local_scalar_dense``), ``nonzero``, ``masked_select`` and ``unique`` (an output size only the device
knows), and indexing with a boolean mask (``x[mask]``, ``x[mask] = v``: a nonzero inside). Counted by wrapping
the ``Tensor`` methods while the mode is on, since they copy without dispatching an operator on the CPU:
``tolist``, ``numpy``, ``cpu()`` and a blocking ``to()`` onto the CPU called from outside torch (``to(device,
non_blocking=True)`` is how host batches go to the device, asynchronously; torch's own calls move a tensor to
the device it is on, which on a CPU looks the same). On the CPU nothing waits, but the count is the same as on
a GPU, where each of these would be a device synchronisation."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# Operators whose output size (or value) the host must wait for.
READING_OPS = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
}
# Indexing operators: a read when an index is a boolean mask.
INDEXING_OPS = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}


TORCH_DIR = str(Path(torch.__file__).parent)


class HostReadError(AssertionError):
    """A host read where none may happen (inside a captured update)."""


def _mask_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _to_host(tensor: torch.Tensor, args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether ``tensor.to(*args, **kwargs)`` is a blocking copy onto the CPU."""
    if kwargs.get("non_blocking") or next((a for a in args if isinstance(a, bool)), False):
        return False
    target = kwargs.get("device")
    for arg in args:
        if isinstance(arg, torch.Tensor):
            target = arg.device
        elif isinstance(arg, (str, torch.device)):
            target = arg
    return target is not None and torch.device(target).type == "cpu"


class HostReads(TorchDispatchMode):
    """``with HostReads() as reads: ...`` then ``reads.count``; ``forbid=True`` raises at the first read;
    ``on_read(what)`` is called at each (a timeline of events)."""

    def __init__(self, *, forbid: bool = False, on_read: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.forbid = forbid
        self.on_read = on_read
        self.count = 0
        self.what: list[str] = []
        self._saved: dict[str, Any] = {}

    def _read(self, what: str) -> None:
        self.count += 1
        self.what.append(what)
        if self.on_read is not None:
            self.on_read(what)
        if self.forbid:
            raise HostReadError(f"a host read ({what}) inside a region that must not read the device")

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in READING_OPS:
            self._read(READING_OPS[func])
        elif func in INDEXING_OPS and _mask_index(args):
            self._read("boolean index")
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostReads:
        mode = self
        originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu", "to")}
        self._saved = originals

        def counted(name: str) -> Callable[..., Any]:
            def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                mode._read(name)
                return originals[name](tensor, *args, **kwargs)

            return method

        def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            outside_torch = not sys._getframe(1).f_code.co_filename.startswith(TORCH_DIR)
            if outside_torch and _to_host(tensor, args, kwargs):
                mode._read("to(cpu)")
            return originals["to"](tensor, *args, **kwargs)

        for name in ("tolist", "numpy", "cpu"):
            setattr(torch.Tensor, name, counted(name))
        torch.Tensor.to = to  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
