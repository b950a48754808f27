"""The error a rescale raises when the checkpoint cannot be rescaled as asked."""
from __future__ import annotations


class RescaleError(RuntimeError):
    """The checkpoint cannot be rescaled as asked; the message says why and what to do."""

