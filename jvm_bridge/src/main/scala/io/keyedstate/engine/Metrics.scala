package io.keyedstate.engine

import org.apache.spark.sql.execution.streaming.state.{StateStoreCustomMetric, StateStoreCustomSizeMetric,
  StateStoreCustomSumMetric, StateStoreCustomTimingMetric}

/** Every custom metric keyedstate reports, shown in `lastProgress.stateOperators[].customMetrics`. */
object Metrics {
  val commitLatency = StateStoreCustomTimingMetric("keyedstateCommitLatencyMs", "keyedstate: commit time")
  val loadLatency = StateStoreCustomTimingMetric("keyedstateLoadLatencyMs", "keyedstate: version load time")
  val cacheWarm = StateStoreCustomTimingMetric("keyedstateCacheWarmMs",
    "keyedstate: scanning the loaded version into the near cache (at load, or once a cold cache's misses cost as much)")
  val changelogBytes = StateStoreCustomSizeMetric("keyedstateChangelogBytes", "keyedstate: changelog bytes committed")
  val writesShipped = StateStoreCustomSumMetric("keyedstateWritesShipped", "keyedstate: keys written per commit")
  val writesUnknown = StateStoreCustomSumMetric("keyedstateWritesUnknown",
    "keyedstate: writes of keys whose previous existence was unknown (the state server reads them before the commit returns)")
  val bridgeGets = StateStoreCustomSumMetric("keyedstateBridgeGets", "keyedstate: reads that crossed to Python")
  val nativeGets = StateStoreCustomSumMetric("keyedstateNativeGets", "keyedstate: near-cache misses read from RocksDB's files in the JVM")
  val nativeSyncs = StateStoreCustomSumMetric("keyedstateNativeSyncs",
    "keyedstate: times the native reader caught up with the state server, which flushes its RocksDB memtable for it")
  val snapshotBytes = StateStoreCustomSizeMetric("keyedstateSnapshotBytesUploaded", "keyedstate: snapshot bytes uploaded")
  val filesUploaded = StateStoreCustomSumMetric("keyedstateSnapshotFilesUploaded", "keyedstate: snapshot files uploaded")
  val filesReused = StateStoreCustomSumMetric("keyedstateSnapshotFilesReused", "keyedstate: snapshot files reused")
  val snapshotsSkipped = StateStoreCustomSumMetric("keyedstateSnapshotsSkipped",
    "keyedstate: unusable snapshots skipped on load in favour of older snapshots and changelogs")
  val cacheHits = StateStoreCustomSumMetric("keyedstateCacheHits", "keyedstate: reads answered by the near cache")
  val cacheAbsent = StateStoreCustomSumMetric("keyedstateCacheAbsent", "keyedstate: reads answered 'absent' locally (complete cache or Bloom filter)")
  val cacheEvictions = StateStoreCustomSumMetric("keyedstateCacheEvictions", "keyedstate: near-cache evictions")
  val cacheBytes = StateStoreCustomSizeMetric("keyedstateCacheBytes", "keyedstate: near-cache bytes")
  val bloomBytes = StateStoreCustomSizeMetric("keyedstateBloomBytes", "keyedstate: Bloom filter bytes")
  val memoryBytes = StateStoreCustomSizeMetric("keyedstateMemoryBytes",
    "keyedstate: memory of the executor (near cache, Bloom filters, native block cache, state servers' RocksDB), per open store")
  val commitEncode = StateStoreCustomTimingMetric("keyedstateCommitEncodeMs", "keyedstate: commit, finishing and compressing the changelog")
  val commitWrite = StateStoreCustomTimingMetric("keyedstateCommitWriteMs", "keyedstate: commit, writing the changelog to the checkpoint (beside the ship when write-behind)")
  val commitShip = StateStoreCustomTimingMetric("keyedstateCommitShipMs", "keyedstate: commit, shipping the changelog to Python (write-behind: held during the write, then released)")
  val ttlExpired = StateStoreCustomSumMetric("keyedstateTtlExpired", "keyedstate: expired entries hidden from reads and scans")
  val ttlCleanedUp = StateStoreCustomSumMetric("keyedstateTtlCleanedUp", "keyedstate: expired entries deleted by cleanup")
  val ttlCleanupMs = StateStoreCustomTimingMetric("keyedstateTtlCleanupMs", "keyedstate: commit, TTL cleanup time")

  val all: Seq[StateStoreCustomMetric] =
    Seq(commitLatency, loadLatency, cacheWarm, changelogBytes, writesShipped, writesUnknown, bridgeGets, nativeGets, nativeSyncs,
      snapshotBytes, filesUploaded,
      filesReused, snapshotsSkipped, cacheHits, cacheAbsent, cacheEvictions, cacheBytes, bloomBytes, memoryBytes, commitEncode, commitWrite,
      commitShip, ttlExpired, ttlCleanedUp, ttlCleanupMs)
}
