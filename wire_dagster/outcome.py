"""What one call to `engine.process` did (the streaming engine's epochs, a derived stage's and a
computation pipeline's alike: engine.py, derived.py, computestage.py), and the bookkeeping every
such call does around its epochs: start from the last commit, record each commit, publish."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .manifest import Manifest

if TYPE_CHECKING:
    from .checkpoint import Checkpoints


@dataclass
class Outcome:
    """What one call to `process` did."""

    manifest: Manifest | None  # the latest committed epoch after the call
    committed: list[int] = field(default_factory=list)  # epochs this call committed
    repaired: list[str] = field(default_factory=list)  # published files self-correction rewrote
    pending: int = 0  # chunks still unread after the call
    changed: dict[str, set[int]] = field(default_factory=dict)  # window -> partitions the epochs changed

    @classmethod
    def resume(cls, cp: Checkpoints) -> Outcome:
        """A call's start: the last committed epoch, its published files repaired (self-correction)."""
        prev = cp.latest()
        out = cls(manifest=prev)
        if prev is not None:
            out.repaired = cp.publish(prev)
        return out

    def took(self, m: Manifest) -> None:
        """Epoch `m` committed: it is the latest, and the partitions it changed are published."""
        self.committed.append(m.epoch)
        self.manifest = m
        for w, ps in m.changed.items():
            self.changed.setdefault(w, set()).update(ps)

    def publish(self, cp: Checkpoints, keep_epochs: int) -> None:
        """After the call's epochs, if it committed any: publish the latest and collect old epochs,
        side by side (each mostly waits on the store): garbage collection deletes only what no kept
        manifest names, and publishing copies only what the latest (kept) manifest names."""
        m = self.manifest
        if not self.committed or m is None:
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wire-gc") as bg:
            collected = bg.submit(cp.gc, keep=keep_epochs, current_run=m.run_id)
            cp.publish(m, {w: sorted(ps) for w, ps in self.changed.items()})
            collected.result()
