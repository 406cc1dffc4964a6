"""What one call to `engine.process` did (the streaming engine's epochs and a derived stage's
alike: engine.py, derived.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .manifest import Manifest


@dataclass
class Outcome:
    """What one call to `process` did."""

    manifest: Manifest | None  # the latest committed epoch after the call
    committed: list[int] = field(default_factory=list)  # epochs this call committed
    repaired: list[str] = field(default_factory=list)  # published files self-correction rewrote
    pending: int = 0  # chunks still unread after the call
