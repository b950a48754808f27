"""Offline tools: they work on a stopped query's checkpoint, not on a running query.

:mod:`.checkpoint` reads the checkpoint layout and rebuilds versions; :mod:`.inspection`
reports what the state holds; :mod:`.rescale` moves key groups to a new partition count
(with :mod:`.routing` and :mod:`.sparkhash`). They read and write only through the byte formats
in :mod:`keyedstate.formats`, never through the state server.
"""
