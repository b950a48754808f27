"""Key-group counts brought through changelogs without applying them: the split by files cuts
a parent's changelogs by heir on top of its base snapshot, so the counts its heirs are published
with are the snapshot's, carried through those records (FORMATS.md, "Key-group counts")."""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from ...formats import changelog, keygroups, rocksdb


class CountsThrough:
    """A base snapshot's key-group counts brought through changelogs that are not written into
    it, by the state server's rule (FORMATS.md, "Key-group counts"): the ops that say whether a
    key was there, and for the keys their writer did not know, the changelogs before, then the
    base. :meth:`disagree` then checks what the seek per key group checks on a rebuilt version."""

    def __init__(self, base: Any, counts: Counter) -> None:
        self.base = base
        self.before = Counter(counts)  # the base's, checked against its files
        self.counts = counts  # changed in place
        self.last: dict[bytes, bool] = {}  # each changelog key: there after the changelogs fed so far

    def feed(self, log_: changelog.Changelog, put: Callable[[bytes, bytes], None],
             delete: Callable[[bytes], None], after: dict[bytes, bool]) -> None:
        """Pass ``log_``'s records to ``put`` and ``delete``, which record in ``after`` whether each
        key is there after it, and count them."""
        change: Counter = Counter()
        fed = log_.feed(put, delete, unknown_keys=True, counts=change)
        rocksdb.count_unknown(None, fed, change, existed=self._existed)
        for group, n in change.items():
            self.counts[group] = self.counts.get(group, 0) + n
        self.last.update(after)

    def _existed(self, keys: list[bytes]) -> list[bool]:
        """Whether each key was there before the changelog being fed: as the changelogs before
        it left it, else as the base holds it."""
        last = self.last
        there = {k: last[k] for k in keys if k in last}
        asked = [k for k in set(keys) if k not in there]
        there.update((k, v is not None) for k, v in zip(asked, rocksdb.multi_get(self.base, asked)))
        return [there[k] for k in keys]

    def disagree(self) -> str | None:
        """Why the counts do not name exactly the key groups the base with the changelogs holds
        keys of (None: they do): no count is below zero, a key group a changelog leaves a key in
        counts some, and one whose changelog keys all end deleted counts some exactly when a key
        of the base's survives them (asked of the base where it held any). Only the key groups
        counted empty and those with deleted keys are looked at: any other holds keys."""
        group_of, prefix_bytes, counts = keygroups.key_group_of_stored_key, keygroups.PREFIX_BYTES, self.counts
        empty = {g for g, n in counts.items() if n < 1}
        for group in empty:
            if counts[group] < 0:
                return f"key group {group} would hold {counts[group]} keys after the changelogs"
        deleted: dict[int, set[bytes]] = {}
        for key in [k for k, there in self.last.items() if not there and len(k) >= prefix_bytes]:
            deleted.setdefault(group_of(key), set()).add(key)  # a shorter key names no key group
        held: set[int] = set()
        if empty or deleted:
            looked_at = empty | deleted.keys()
            held = {g for k, there in self.last.items()
                    if there and (g := group_of(k)) in looked_at}  # puts: never a shorter key
        if held & empty:
            group = min(held & empty)
            return f"key group {group} holds keys after the changelogs, the counts say {counts.get(group, 0)}"
        for group, gone in deleted.items():
            if group in held:
                continue
            survives = self.before.get(group, 0) > 0 and self._survives(group, gone)
            if survives != (counts.get(group, 0) > 0):
                return (f"key group {group} holds {'keys' if survives else 'no key'} after the changelogs, the counts "
                        f"say {counts.get(group, 0)}")
        return None

    def _survives(self, group: int, gone: set[bytes]) -> bool:
        """Whether the base holds a key of ``group`` not in ``gone``."""
        it = self.base.iter()
        it.seek(keygroups.prefix(group))
        end = keygroups.prefix(group + 1)
        while it.valid() and it.key() < end:
            if it.key() not in gone:
                return True
            it.next()
        return False
