"""The one error type for a bad checkpoint."""
from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint is missing, not keyedstate's, or holds a corrupt file (named in the message,
    with what to do)."""


class NotKeyedstateCheckpoint(CheckpointError):
    """The checkpoint's state is another state store provider's (the message names it)."""


CheckpointProblem = CheckpointError
"""The name the storage-based tools used; an alias for one release."""
