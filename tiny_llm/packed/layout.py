"""Arena layout: where each named parameter lives inside one ``[N, D_padded]`` tensor."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

PAD = 64
"""Every entry starts at a multiple of 64 elements (aligned vector loads, 256-byte rows in fp32)."""


@dataclass(frozen=True)
class Entry:
    """One parameter: its name, shape and slice [start, start+numel) of an arena row."""

    name: str
    shape: tuple[int, ...]
    start: int
    numel: int

    @property
    def decays(self) -> bool:
        """AdamW weight decay applies to >=2-D tensors only (not norm scales)."""
        return len(self.shape) >= 2


@dataclass(frozen=True)
class ArenaLayout:
    """Ordered entries and the padded row width of the arena."""

    entries: tuple[Entry, ...]
    width: int

    @classmethod
    def from_shapes(cls, shapes: Iterable[tuple[str, tuple[int, ...]]]) -> ArenaLayout:
        entries, offset = [], 0
        for name, shape in shapes:
            numel = 1
            for size in shape:
                numel *= size
            entries.append(Entry(name, tuple(shape), offset, numel))
            offset += (numel + PAD - 1) // PAD * PAD
        return cls(tuple(entries), offset)

    @property
    def numel(self) -> int:
        """Real (unpadded) parameters of one worker."""
        return sum(e.numel for e in self.entries)

    def view(self, arena: torch.Tensor, entry: Entry) -> torch.Tensor:
        """``[N, *shape]`` view of one entry in an ``[N, width]`` arena (shares storage)."""
        return arena[:, entry.start : entry.start + entry.numel].view(arena.shape[0], *entry.shape)

    def views(self, arena: torch.Tensor) -> dict[str, torch.Tensor]:
        return {e.name: self.view(arena, e) for e in self.entries}

    def decay_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[width]`` bool mask: true where weight decay applies, false on norm scales and padding."""
        mask = torch.zeros(self.width, dtype=torch.bool, device=device)
        for e in self.entries:
            if e.decays:
                mask[e.start : e.start + e.numel] = True
        return mask

    def metadata(self) -> list[dict]:
        """JSON-able description stored in checkpoints to reject a mismatching layout."""
        return [asdict(e) | {"shape": list(e.shape)} for e in self.entries]
