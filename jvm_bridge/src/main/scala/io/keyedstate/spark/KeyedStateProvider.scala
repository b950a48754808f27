package io.keyedstate.spark

import org.apache.hadoop.conf.Configuration
import org.apache.spark.keyedstate.SparkErrors
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType

import io.keyedstate.bridge.ServerLaunch
import io.keyedstate.checkpoint.CheckpointFileException
import io.keyedstate.engine.{Metrics, OpenStores, StoreEngine}
import io.keyedstate.offline.{ChangeFeed, SnapshotReplay}

/**
 * keyedstate's StateStoreProvider: Spark's contract and nothing else (Spark's
 * `RocksDBStateStoreProvider` is the model). Storage, versions and files belong to the
 * [[StoreEngine]]; a version handed to a task is a [[KeyedStateStore]].
 */
class KeyedStateProvider extends StateStoreProvider with SupportsFineGrainedReplay {
  @volatile private var engine: StoreEngine = _
  private var storeId: StateStoreId = _
  private var hadoopConf: Configuration = _

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConfs: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    if (useColumnFamilies || useMultipleValuesPerKey) {
      throw new UnsupportedOperationException(
        "keyedstate does not support column families or multiple values per key (only " +
          "transformWithState uses them, and Spark runs it only on RocksDBStateStoreProvider)")
    }
    this.storeId = stateStoreId
    this.hadoopConf = hadoopConf
    val confs = storeConfs.sqlConfs.filter(_._1.startsWith(ServerLaunch.ConfPrefix))
    engine = new StoreEngine(stateStoreId, keySchema, valueSchema, keyStateEncoderSpec, storeConfs, hadoopConf, confs)
    engine.open() // validates the confs again: a driver that could not check them fails here
    OpenStores.register(engine)
  }

  override def stateStoreId: StateStoreId = storeId

  override def getStore(version: Long, uniqueId: Option[String], forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore =
    store(version, uniqueId, forceSnapshotOnCommit, loadEmpty).willCommit()

  private def store(version: Long, uniqueId: Option[String], forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): KeyedStateStore =
    loading(new KeyedStateStore(engine, version, uniqueId, forceSnapshotOnCommit, loadEmpty, hadoopConf))

  /** A version, snapshot or changelog the checkpoint cannot serve is Spark's
   *  `CANNOT_LOAD_STATE_STORE.UNCATEGORIZED`, its message keyedstate's one line naming the files
   *  (the change feed's later reads: [[ChangeIterator]]). */
  private def loading[T](f: => T): T =
    try f catch { case e: CheckpointFileException => throw SparkErrors.cannotLoadStateStore(e) }

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore =
    store(version, uniqueId, forceSnapshotOnCommit = false, loadEmpty = false)

  /**
   * Aggregations open a read store and then a write store on the same version: reuse it. Only
   * this provider's own: Spark hands over the read store its task thread last opened, of
   * whichever operator (Spark's RocksDB provider asserts the same store id). An own read store
   * that cannot be reused is aborted, so that it does not stay the near cache's writer (a TTL
   * refresh on read writes); another keyedstate provider's is left to its operator, and a read
   * store of another provider class is released, as Spark's default does.
   */
  override def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long,
      uniqueId: Option[String], forceSnapshotOnCommit: Boolean): StateStore = readStore match {
    case s: KeyedStateStore if s.servedBy(engine) =>
      if (s.version == version && s.isUpdating && s.uniqueIdLoaded == engine.idOf(uniqueId)) s.willCommit()
      else {
        if (s.isUpdating) s.abort()
        getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty = false)
      }
    case _: KeyedStateStore => getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty = false)
    case other =>
      other.release()
      getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty = false)
  }

  override def doSnapshotMaintenance(): Unit = if (engine != null) engine.uploadSnapshots()
  override def doCleanupMaintenance(): Unit = if (engine != null) engine.cleanupFiles()
  override def doMaintenance(): Unit = { doSnapshotMaintenance(); doCleanupMaintenance() }

  override def close(): Unit = if (engine != null) {
    OpenStores.unregister(engine)
    engine.close()
  }

  /** The state data source's `snapshotStartBatchId` (see [[SnapshotReplay]]). */
  override def replayStateFromSnapshot(snapshotVersion: Long, endVersion: Long, readOnly: Boolean,
      snapshotVersionStateStoreCkptId: Option[String], endVersionStateStoreCkptId: Option[String]): StateStore = {
    loading(SnapshotReplay.check(engine, snapshotVersion, endVersion, engine.idOf(snapshotVersionStateStoreCkptId)))
    val s = store(endVersion, endVersionStateStoreCkptId, forceSnapshotOnCommit = false, loadEmpty = false)
    if (readOnly) s else s.willCommit()
  }

  /** The state data source's `readChangeFeed` ([[ChangeFeed]]). */
  override def getStateStoreChangeDataReader(startVersion: Long, endVersion: Long, colFamilyNameOpt: Option[String],
      endVersionStateStoreCkptId: Option[String]) = {
    colFamilyNameOpt.filter(_ != StateStore.DEFAULT_COL_FAMILY_NAME).foreach { cf =>
      throw new UnsupportedOperationException(s"keyedstate has no column families (asked for '$cf')")
    }
    loading(new ChangeFeed(engine.files, engine.codec, startVersion, endVersion,
      engine.idOf(endVersionStateStoreCkptId), engine.describe))
  }

  /** Spark asks on the driver while planning a stateful operator, before any task: the confs
   *  are checked there ([[DriverConfCheck]]). */
  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] = {
    DriverConfCheck.onDriver()
    Metrics.all
  }
}
