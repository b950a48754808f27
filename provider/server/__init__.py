"""The state server: one Python process per executor core that owns its stores' RocksDB.

The JVM shim starts it (``python -m keyedstate.server``, :mod:`.main`), drives it over py4j (a
Unix socket, :mod:`.callback_server`) for control (:mod:`.api`) and over a Unix socket for bulk
data (:mod:`.data`); :mod:`.store` keeps one version of one store partition, applying committed
changelogs behind (:mod:`.write_behind`) and scanning for expired entries (:mod:`.ttl_scan`);
:mod:`.snapshots` stages RocksDB checkpoints for upload.
"""
