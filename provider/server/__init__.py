"""The state server: one Python process per executor core that owns its stores' RocksDB.

The JVM shim starts it (``python -m keyedstate.server``), drives it over py4j (a Unix socket) for control
(:mod:`.api`) and over a Unix socket for bulk data (:mod:`.data`); :mod:`.store` keeps one
version of one store partition, :mod:`.snapshots` stages RocksDB checkpoints for upload.
"""
