package io.keyedstate.spark

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType
import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.array.ByteArrayMethods

import io.keyedstate.engine.{Bytes, CommitPhases, CommitResult, Metrics, OpenStores, StoreEngine}

/**
 * One version of one store partition, as handed to an operator for one task: Spark's StateStore
 * contract, rows encoded to stored bytes ([[io.keyedstate.format.KeyCodec]]) over the engine's
 * view of the version. An explicit state machine, as in Spark's RocksDBStateStore: every call
 * checks it (UPDATING, then COMMITTED or ABORTED). Also serves as the read store (the state data
 * source, aggregation's read-then-write on the same version).
 */
final class KeyedStateStore private[spark] (engine: StoreEngine, override val version: Long, uniqueId: Option[String],
    forceSnapshot: Boolean, loadEmpty: Boolean, hadoopConf: Configuration) extends StateStore {
  import KeyedStateStore._

  @volatile private var state: State = Updating
  private val current = engine.begin(version, uniqueId, loadEmpty, () => state == Updating)
  private val view = current.view
  private val codec = engine.codec
  private var commitResult = CommitResult(0, 0, 0, 0)
  private var commitMs = 0L
  private var writesShipped = 0L
  private var writesUnknown = 0L
  // The key last encoded, and where its row starts in it: an operator that reads a key and then
  // writes it (aggregation, dedup, join) encodes and hashes it once, not twice.
  private var lastKey: Bytes = null
  private var lastRowAt = 0

  override def id: StateStoreId = engine.id
  private[spark] def isUpdating: Boolean = state == Updating
  private[spark] def servedBy(e: StoreEngine): Boolean = engine eq e
  private[spark] def uniqueIdLoaded: Option[String] = current.uniqueId
  /** This store is a task's write store: its commit's file starts opening now. */
  private[spark] def willCommit(): this.type = { if (state == Updating) engine.prepareCommit(current); this }

  private def verify(condition: Boolean, message: => String): Unit =
    if (!condition) throw new IllegalStateException(s"keyedstate: $message (store of version $version of ${engine.describe})")

  private def checkCf(colFamilyName: String): Unit =
    if (colFamilyName != StateStore.DEFAULT_COL_FAMILY_NAME) {
      throw new UnsupportedOperationException(s"keyedstate has no column family '$colFamilyName'")
    }

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
    checkCf(colFamilyName)
    val stored = view.get(encoded(key))
    if (stored == null) null else codec.decodeValue(stored)
  }

  override def put(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
    checkCf(colFamilyName)
    verify(state == Updating, "Cannot put after already committed or aborted")
    require(value != null, "keyedstate: cannot put a null value")
    view.put(encoded(key), codec.encodeValue(value))
  }

  override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
    checkCf(colFamilyName)
    verify(state == Updating, "Cannot remove after already committed or aborted")
    view.delete(encoded(key))
  }

  /** The stored key of `key`: the last one encoded if `key`'s row bytes are its row's (a stored
   *  key is a function of them), else a new one. */
  private def encoded(key: UnsafeRow): Bytes = {
    val last = lastKey
    val size = key.getSizeInBytes
    if (last != null && last.bytes.length - lastRowAt == size &&
        ByteArrayMethods.arrayEquals(key.getBaseObject, key.getBaseOffset, last.bytes, Platform.BYTE_ARRAY_OFFSET + lastRowAt, size)) {
      last
    } else {
      val fresh = new Bytes(codec.encodeKey(key))
      lastKey = fresh
      lastRowAt = codec.keyRowOffset(fresh.bytes)
      fresh
    }
  }

  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    checkCf(colFamilyName)
    rows(view.scan(Array.emptyByteArray))
  }

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    checkCf(colFamilyName)
    rows(view.scan(codec.encodePrefix(prefixKey)))
  }

  private def rows(entries: Iterator[(Array[Byte], Array[Byte])]): StateStoreIterator[UnsafeRowPair] =
    new StateStoreIterator(entries.map { case (k, v) => new UnsafeRowPair(codec.decodeKey(k), codec.decodeValue(v)) }, () => ())

  override def commit(): Long = {
    verify(state == Updating, "Cannot commit after already committed or aborted")
    val started = System.nanoTime()
    writesShipped = current.buffered.buffer.size
    writesUnknown = current.buffered.buffer.unknownOps
    commitResult = engine.commit(current, forceSnapshot)
    current.buffered.buffer.clear()
    current.buffered.committed.learned.clear()
    state = Committed
    commitMs = (System.nanoTime() - started) / 1000000
    StateStore.reportCommitToCoordinator(commitResult.version, id, hadoopConf)
    commitResult.version
  }

  override def abort(): Unit = {
    verify(state == Updating || state == Aborted, "Cannot abort after already committed")
    if (state == Updating) engine.abandon(current)
    current.buffered.buffer.clear()
    current.buffered.committed.learned.clear()
    state = Aborted
  }

  override def release(): Unit = ()
  override def hasCommitted: Boolean = state == Committed

  override def metrics: StateStoreMetrics = {
    val cache = engine.nearCache
    val counters = cache.takeCounters() // per batch: reset on read
    val nativeGets = engine.nativeGets.getAndSet(0)
    val phases = if (hasCommitted) engine.lastCommitPhases else CommitPhases(0, 0, 0)
    val custom: Map[StateStoreCustomMetric, Long] = Map(
      Metrics.commitEncode -> phases.encodeMs,
      Metrics.commitWrite -> phases.writeMs,
      Metrics.commitShip -> phases.shipMs,
      Metrics.commitLatency -> commitMs,
      Metrics.loadLatency -> engine.loadMs.getAndSet(0),
      Metrics.cacheWarm -> engine.warmMs.getAndSet(0),
      Metrics.changelogBytes -> commitResult.changelogBytes,
      Metrics.writesShipped -> writesShipped,
      Metrics.writesUnknown -> writesUnknown,
      Metrics.bridgeGets -> math.max(0L, counters.misses - nativeGets),
      Metrics.nativeGets -> nativeGets,
      Metrics.nativeSyncs -> engine.nativeSyncs.getAndSet(0),
      Metrics.cacheHits -> counters.hits,
      Metrics.cacheAbsent -> counters.absent,
      Metrics.cacheEvictions -> counters.evictions,
      Metrics.cacheBytes -> cache.sizeBytes,
      Metrics.bloomBytes -> cache.bloomBytes,
      Metrics.memoryBytes -> OpenStores.memoryBytesPerStore(),
      Metrics.snapshotBytes -> engine.bytesUploaded.getAndSet(0),
      Metrics.filesUploaded -> engine.filesUploaded.getAndSet(0),
      Metrics.filesReused -> engine.filesReused.getAndSet(0),
      Metrics.snapshotsSkipped -> engine.snapshotsSkipped.getAndSet(0),
      Metrics.ttlExpired -> current.ttl.expiredSeen,
      Metrics.ttlCleanedUp -> commitResult.ttlCleanedUp,
      Metrics.ttlCleanupMs -> commitResult.ttlCleanupMs)
    StateStoreMetrics(engine.numKeys, current.buffered.buffer.estimatedBytes + engine.serverMemoryBytes(), custom)
  }

  /** Under checkpoint format 2: the committed version, its unique id and the one it was built on. */
  override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo =
    if (hasCommitted) StateStoreCheckpointInfo(id.partitionId, commitResult.version, commitResult.uniqueId, commitResult.baseUniqueId)
    else StateStoreCheckpointInfo(id.partitionId, version, current.uniqueId, None)

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

object KeyedStateStore {
  private sealed trait State
  private case object Updating extends State
  private case object Committed extends State
  private case object Aborted extends State
}
