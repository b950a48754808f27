package io.keyedstate.spark

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType

/**
 * One version of one store partition, as handed to an operator for one task. Writes go to a
 * [[WriteBuffer]]; reads consult it first and then the Python store (which holds `version`
 * unchanged until this store commits). Also serves as the read store (state data source,
 * aggregation's read-then-write on the same version).
 */
final class KeyedStateStore(provider: KeyedStateProvider, override val version: Long,
    forceSnapshot: Boolean, nowMs: Long) extends StateStore {

  private val buffer = new WriteBuffer
  // What this version's round trips to Python said about keys the near cache could not answer
  // (key -> existed): lets the commit log every write as new/existing even after the LRU
  // evicted the key, so it can apply behind. Version-local, like the buffer.
  private val fetched = new java.util.HashMap[Bytes, java.lang.Boolean]()
  private val codec = provider.codec
  // TTL: one "now" per version (see TtlClock); entries written at or before expireBefore expired.
  private val ttl = provider.ttl
  private val expireBefore = if (ttl.perEntry) nowMs - ttl.ttlMs else Long.MinValue
  private var expiredHidden = 0L
  private var commitResult = CommitResult(0, 0, 0, 0)
  private var committedVersion = -1L
  private var aborted = false
  private var commitMs = 0L
  private var changelogBytes = 0L
  private var writesShipped = 0L

  override def id: StateStoreId = provider.id

  private def checkCf(colFamilyName: String): Unit =
    if (colFamilyName != StateStore.DEFAULT_COL_FAMILY_NAME) {
      throw new UnsupportedOperationException(s"keyedstate has no column family '$colFamilyName'")
    }

  private def checkWritable(): Unit = {
    if (committedVersion >= 0) throw new IllegalStateException(s"store of version $version was already committed")
    if (aborted) throw new IllegalStateException(s"store of version $version was aborted")
  }

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
    checkCf(colFamilyName)
    val encoded = new Bytes(codec.encodeKey(key))
    val stored = lookup(encoded)
    if (stored == null) null
    else if (expired(stored)) {
      expiredHidden += 1
      if (ttl.returnExpired) codec.decodeValue(stored) else null
    } else {
      if (ttl.perEntry && ttl.updateOnRead && committedVersion < 0 && !aborted &&
          stored(0) == KeyCodec.TimedValue && KeyCodec.writtenAt(stored) != nowMs) {
        buffer.put(encoded, codec.restamp(stored, nowMs)) // a read refreshes the entry's TTL
      }
      codec.decodeValue(stored)
    }
  }

  private def expired(stored: Array[Byte]): Boolean = ttl.perEntry && codec.isExpired(stored, expireBefore)

  // Join index rows carry a write time too: it tells cleanup which rows may have outlived
  // their count (a row is never older than its count's last write).
  private def encodeValue(value: UnsafeRow): Array[Byte] =
    if (ttl.enabled) codec.encodeValue(value, nowMs) else codec.encodeValue(value)

  /** This version's own write, else the committed value (near cache, else Python). */
  private def lookup(key: Bytes): Array[Byte] = {
    val pending = buffer.lookup(key)
    if (pending != null) {
      if (pending eq WriteBuffer.Tombstone) null else pending
    } else provider.lookupCommitted(key, fetched)
  }

  override def put(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
    checkCf(colFamilyName)
    checkWritable()
    require(value != null, "keyedstate: cannot put a null value")
    buffer.put(new Bytes(codec.encodeKey(key)), encodeValue(value))
  }

  override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
    checkCf(colFamilyName)
    checkWritable()
    buffer.delete(new Bytes(codec.encodeKey(key)))
  }

  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    checkCf(colFamilyName)
    scan(Array.emptyByteArray)
  }

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    checkCf(colFamilyName)
    scan(codec.encodePrefix(prefixKey))
  }

  /**
   * Committed entries with `prefix` (fetched from Python in chunks) that this version has not
   * overwritten, then this version's own puts with that prefix. Uses a point-in-time copy of
   * the buffer, so callers may remove keys while iterating (watermark eviction does).
   */
  private def scan(prefix: Array[Byte]): StateStoreIterator[UnsafeRowPair] = {
    val pending = buffer.snapshot()
    val overwritten = new java.util.HashSet[Bytes](pending.length * 2)
    pending.foreach { case (k, _) => overwritten.add(k) }
    // A complete near cache serves full scans locally; prefix scans (one per key in session
    // windows) would have to walk the whole cache, so they go to RocksDB's sorted index.
    val fromCache = prefix.isEmpty && provider.cache.complete && provider.cache.version == version
    val committed = (if (fromCache) provider.cache.snapshot().iterator else new Iterator[(Array[Byte], Array[Byte])] {
      private var chunk: ScanChunkView = fetch(null)
      private def fetch(after: Array[Byte]) = new ScanChunkView(provider.scanChunk(prefix, after))
      override def hasNext: Boolean = {
        while (!chunk.hasNext && chunk.hasMore) chunk = fetch(chunk.lastKey)
        chunk.hasNext
      }
      override def next(): (Array[Byte], Array[Byte]) = { hasNext; chunk.next() }
    }).filterNot { case (k, _) => overwritten.contains(new Bytes(k)) }
    val own = pending.iterator.collect {
      case (k, v) if !(v eq WriteBuffer.Tombstone) && Bytes.startsWith(k.bytes, prefix) => (k.bytes, v)
    }
    // Scans never refresh a TTL: Spark's operators scan all state for watermarks and timeouts.
    val visible = if (!ttl.perEntry || ttl.returnExpired) committed ++ own else (committed ++ own).filter {
      case (_, v) => if (expired(v)) { expiredHidden += 1; false } else true
    }
    val rows = visible.map { case (k, v) => new UnsafeRowPair(codec.decodeKey(k), codec.decodeValue(v)) }
    new StateStoreIterator(rows, () => ())
  }


  override def commit(): Long = {
    checkWritable()
    val started = System.nanoTime()
    writesShipped = buffer.size
    commitResult = provider.commitVersion(version, buffer, forceSnapshot, fetched, nowMs)
    val newVersion = commitResult.version
    changelogBytes = commitResult.changelogBytes
    buffer.clear()
    fetched.clear()
    committedVersion = newVersion
    commitMs = (System.nanoTime() - started) / 1000000
    StateStore.reportCommitToCoordinator(newVersion, id, provider.hadoopConfiguration)
    newVersion
  }

  override def abort(): Unit = {
    buffer.clear()
    fetched.clear()
    if (committedVersion < 0) aborted = true
  }

  override def release(): Unit = ()
  override def hasCommitted: Boolean = committedVersion >= 0

  override def metrics: StateStoreMetrics = {
    val counters = provider.cache.takeCounters() // per batch: reset on read
    val nativeGets = provider.metricNativeGets.getAndSet(0)
    val phases = if (hasCommitted) provider.lastCommitPhases else CommitPhases(0, 0, 0)
    val custom: Map[StateStoreCustomMetric, Long] = Map(
      CustomMetrics.commitEncode -> phases.encodeMs,
      CustomMetrics.commitWrite -> phases.writeMs,
      CustomMetrics.commitShip -> phases.shipMs,
      CustomMetrics.commitLatency -> commitMs,
      CustomMetrics.loadLatency -> provider.metricLoadMs.getAndSet(0),
      CustomMetrics.changelogBytes -> changelogBytes,
      CustomMetrics.writesShipped -> writesShipped,
      CustomMetrics.bridgeGets -> math.max(0L, counters.misses - nativeGets),
      CustomMetrics.nativeGets -> nativeGets,
      CustomMetrics.cacheHits -> counters.hits,
      CustomMetrics.cacheAbsent -> counters.absent,
      CustomMetrics.cacheEvictions -> counters.evictions,
      CustomMetrics.cacheBytes -> provider.cache.sizeBytes,
      CustomMetrics.bloomBytes -> provider.cache.bloomBytes,
      CustomMetrics.snapshotBytes -> provider.metricSnapshotBytes.getAndSet(0),
      CustomMetrics.filesUploaded -> provider.metricFilesUploaded.getAndSet(0),
      CustomMetrics.filesReused -> provider.metricFilesReused.getAndSet(0),
      CustomMetrics.ttlExpired -> expiredHidden,
      CustomMetrics.ttlCleanedUp -> commitResult.ttlCleanedUp,
      CustomMetrics.ttlCleanupMs -> commitResult.ttlCleanupMs)
    StateStoreMetrics(provider.numKeys, buffer.estimatedBytes + provider.memoryUsedBytes(), custom)
  }

  override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo =
    StateStoreCheckpointInfo(id.partitionId, if (committedVersion >= 0) committedVersion else version, None, None)

  override def allColumnFamilyNames: Set[String] = Set(StateStore.DEFAULT_COL_FAMILY_NAME)

  private def unsupported(what: String) = new UnsupportedOperationException(
    s"keyedstate does not support $what (only transformWithState uses it, and Spark runs " +
      "transformWithState only on its RocksDBStateStoreProvider)")

  override def removeColFamilyIfExists(colFamilyName: String): Boolean = throw unsupported("column families")
  override def createColFamilyIfAbsent(colFamilyName: String, keySchema: StructType, valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec, useMultipleValuesPerKey: Boolean, isInternal: Boolean): Unit =
    throw unsupported("column families")
  override def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = throw unsupported("putList")
  override def merge(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = throw unsupported("merge")
  override def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = throw unsupported("mergeList")
  override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] = throw unsupported("valuesIterator")
  override def prefixScanWithMultiValues(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    throw unsupported("multiple values per key")
  override def iteratorWithMultiValues(colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    throw unsupported("multiple values per key")
}

/** Walks one scan chunk. */
private final class ScanChunkView(chunk: io.keyedstate.bridge.ScanChunk) extends Iterator[(Array[Byte], Array[Byte])] {
  private var i = 0
  def hasMore: Boolean = chunk.hasMore
  def lastKey: Array[Byte] = chunk.keys(chunk.keys.length - 1)
  override def hasNext: Boolean = i < chunk.keys.length
  override def next(): (Array[Byte], Array[Byte]) = { val e = (chunk.keys(i), chunk.values(i)); i += 1; e }
}
