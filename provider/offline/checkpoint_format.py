"""The offline tools that handle checkpoint format 1 only (inspect reads state files by version
alone; rescale, migrate and the state processor's changes rewrite the commit log) refuse a
checkpoint under format 2 with this one check, each naming its own error and reason."""
from __future__ import annotations

from ..checkpoint import Checkpoint, CheckpointError


def refuse_checkpoint_format_2(ck: Checkpoint, committed: int, *, reason: str,
                               error: type[Exception] = CheckpointError) -> None:
    """Raise ``error`` naming the commit if batch ``committed`` runs under checkpoint format 2."""
    if ck.checkpoint_format(committed) == 2:
        raise error(f"{ck.path('commits', str(committed))}: {reason}")
