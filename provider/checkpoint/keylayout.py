"""The key layout of a store whose files do not record it (FORMATS.md, "Key layout"): the one
Python copy of the rule the JVM's ``KeyCodec`` applied when manifests did not record it yet."""
from __future__ import annotations

from ..formats.stored import KeyLayout


def legacy_key_layout(store: str, operator: str, fields: int) -> KeyLayout:
    """A join's index store and session windows do not hash their last column; every other
    store hashes all ``fields`` key columns."""
    if store.endswith("keyWithIndexToValue"):
        return KeyLayout(fields, fields - 1)
    if "session" in operator.lower():
        return KeyLayout(fields, fields - 1, prefix_columns=fields - 1)
    return KeyLayout(fields, fields)


def partition_key_layout(op, store: str, key_fields: int, recorded: KeyLayout | None) -> KeyLayout:
    """The recorded key layout, else :func:`legacy_key_layout` for operator ``op`` (its name)."""
    if recorded is not None:
        return recorded
    return legacy_key_layout(store, op.name or "", key_fields)
