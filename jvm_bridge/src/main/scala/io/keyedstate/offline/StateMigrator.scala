package io.keyedstate.offline

import java.util.UUID

import scala.jdk.CollectionConverters._

import org.apache.hadoop.fs.Path
import org.apache.spark.HashPartitioner
import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.{DataType, StructType}
import org.apache.spark.util.SerializableConfiguration

/**
 * Writes one store of a stopped query's state, read with Spark's state data source from the
 * provider that wrote it, as version `batchId + 1` of another provider (`keyedstate migrate`;
 * the Python side, `keyedstate/offline/migration.py`, plans it and switches the provider).
 *
 * Every target is written by its own provider class through Spark's `StateStoreProvider` API
 * (`createAndInit`, `getStore`, `put`, `commit`, maintenance), never by re-implementing its files:
 *  - RocksDB and keyedstate: `getStore(batchId, loadEmpty = true)` with a snapshot forced on
 *    commit, then maintenance, so that version `batchId + 1` is one snapshot (Spark's
 *    `StatePartitionAllColumnFamiliesWriter` does the same for RocksDB);
 *  - HDFS-backed (it cannot `loadEmpty`): version 1 written from an empty store in a scratch
 *    directory (a delta holding only puts), published as `<batchId + 1>.snapshot`, the file the
 *    provider reads as the whole state of that version.
 * One task per partition (the rows are routed by their `partition_id`); a partition without
 * rows gets an empty version too. Returns the rows written per partition.
 */
object StateMigrator {
  def migrateStore(spark: SparkSession, source: DataFrame, checkpointRoot: String, operatorId: Long,
      storeName: String, numPartitions: Int, batchId: Long, keySchemaJson: String, valueSchemaJson: String,
      prefixColumns: Int, targetProvider: String, confs: java.util.Map[String, String]): Array[Long] = {
    val keySchema = DataType.fromJson(keySchemaJson).asInstanceOf[StructType]
    val valueSchema = DataType.fromJson(valueSchemaJson).asInstanceOf[StructType]
    val sqlConf = spark.sessionState.conf.clone()
    confs.asScala.foreach { case (k, v) => sqlConf.setConfString(k, v) }
    sqlConf.setConfString("spark.sql.streaming.stateStore.providerClass", targetProvider)
    val storeConf = StateStoreConf(sqlConf)
    val hadoopConf = new SerializableConfiguration(spark.sessionState.newHadoopConf())
    val nk = keySchema.length
    val nv = valueSchema.length
    val rows = source.select("key", "value", "partition_id").queryExecution.toRdd.mapPartitions { it =>
      val kp = UnsafeProjection.create(keySchema)
      val vp = UnsafeProjection.create(valueSchema)
      // copy(): a projection reuses its buffer, and getBytes returns that very buffer
      it.map(r => (r.getInt(2), (kp(r.getStruct(0, nk)).copy().getBytes, vp(r.getStruct(1, nv)).copy().getBytes)))
    }
    rows.partitionBy(new HashPartitioner(numPartitions)).mapPartitionsWithIndex { (pid, it) =>
      val data = it.map(_._2)
      val n = if (targetProvider.endsWith(".HDFSBackedStateStoreProvider")) {
        writeHdfs(storeConf, hadoopConf.value, checkpointRoot, operatorId, storeName, pid, batchId, keySchema,
          valueSchema, prefixColumns, data)
      } else {
        val id = StateStoreId(checkpointRoot + "/state", operatorId, pid, storeName)
        write(storeConf, hadoopConf.value, id, batchId, keySchema, valueSchema, prefixColumns, data, snapshot = true)
      }
      Iterator(pid.toLong -> n)
    }.collect().sortBy(_._1).map(_._2)
  }

  private def spec(keySchema: StructType, prefixColumns: Int): KeyStateEncoderSpec =
    if (prefixColumns > 0) PrefixKeyScanStateEncoderSpec(keySchema, prefixColumns) else NoPrefixKeyStateEncoderSpec(keySchema)

  private def write(storeConf: StateStoreConf, hadoopConf: org.apache.hadoop.conf.Configuration, id: StateStoreId,
      batchId: Long, keySchema: StructType, valueSchema: StructType, prefixColumns: Int,
      data: Iterator[(Array[Byte], Array[Byte])], snapshot: Boolean): Long = {
    val provider = StateStoreProvider.createAndInit(StateStoreProviderId(id, UUID.randomUUID()), keySchema, valueSchema,
      spec(keySchema, prefixColumns), false, storeConf, hadoopConf, false, None)
    try {
      val store = if (snapshot) provider.getStore(batchId, None, true, true) else provider.getStore(batchId)
      var n = 0L
      try {
        data.foreach { case (k, v) =>
          store.put(row(k, keySchema.length), row(v, valueSchema.length))
          n += 1
        }
        store.commit()
      } catch {
        case e: Throwable => store.abort(); throw e
      }
      provider.doMaintenance()
      n
    } finally provider.close()
  }

  private def writeHdfs(storeConf: StateStoreConf, hadoopConf: org.apache.hadoop.conf.Configuration, root: String,
      operatorId: Long, storeName: String, pid: Int, batchId: Long, keySchema: StructType, valueSchema: StructType,
      prefixColumns: Int, data: Iterator[(Array[Byte], Array[Byte])]): Long = {
    val scratch = new Path(root, s"_keyedstate_migration/${UUID.randomUUID()}")
    val scratchId = StateStoreId(scratch.toString, operatorId, pid, storeName)
    val fm = CheckpointFileManager.create(new Path(root), hadoopConf)
    try {
      val n = write(storeConf, hadoopConf, scratchId, 0L, keySchema, valueSchema, prefixColumns, data, snapshot = false)
      val target = StateStoreId(root + "/state", operatorId, pid, storeName).storeCheckpointLocation()
      fm.mkdirs(target)
      val in = fm.open(new Path(scratchId.storeCheckpointLocation(), "1.delta"))
      try {
        val out = fm.createAtomic(new Path(target, s"${batchId + 1}.snapshot"), true)
        try { org.apache.hadoop.io.IOUtils.copyBytes(in, out, 1 << 16, false); out.close() }
        catch { case e: Throwable => out.cancel(); throw e }
      } finally in.close()
      n
    } finally fm.delete(scratch)
  }

  private def row(bytes: Array[Byte], fields: Int): UnsafeRow = {
    val r = new UnsafeRow(fields)
    r.pointTo(bytes, bytes.length)
    r
  }
}
