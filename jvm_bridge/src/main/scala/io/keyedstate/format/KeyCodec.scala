package io.keyedstate.format

import java.nio.ByteBuffer

import org.apache.spark.sql.catalyst.expressions.{BoundReference, Murmur3Hash, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, NoPrefixKeyStateEncoderSpec, PrefixKeyScanStateEncoderSpec}
import org.apache.spark.sql.types.StructType
import org.apache.spark.unsafe.Platform

/**
 * Byte layouts of stored keys and values (spec: FORMATS.md, "Stored keys and values"; the Python
 * twin, which reads key groups, prefixes and write times only, is `keyedstate/formats/stored.py`).
 *
 * key   = u32 key group | UnsafeRow bytes                                  (no prefix scan)
 * key   = u32 key group | u32 prefix length | prefix row | full key row     (prefix scan)
 * value = u8 1 | UnsafeRow bytes                                           (plain)
 * value = u8 2 | u64 time of last write, epoch ms | UnsafeRow bytes        (with TTL)
 *
 * The key group ([[KeyGroups]]) comes from Murmur3Hash(partition key columns, 42): the hash Spark's
 * HashPartitioning uses to route the key. The partition key is the whole key, except for
 * the join's keyWithIndexToValue stores (the trailing `index`) and session windows (the
 * trailing session start), where it is the key minus its last column. Not thread-safe (the
 * projections are reused): one codec per store instance.
 */
final class KeyCodec(keySchema: StructType, valueSchema: StructType, spec: KeyStateEncoderSpec,
    storeName: String, val keyGroups: Int) {

  val prefixColumns: Int = spec match {
    case p: PrefixKeyScanStateEncoderSpec => p.numColsPrefixKey
    case _: NoPrefixKeyStateEncoderSpec => 0
    case other => throw new UnsupportedOperationException(
      s"keyedstate does not support the key encoder $other (used by transformWithState, which " +
        "Spark only runs on its own RocksDBStateStoreProvider)")
  }

  /** How many leading key columns Spark hashes to pick the key's partition. */
  val partitionKeyColumns: Int =
    if (storeName.endsWith("keyWithIndexToValue")) keySchema.length - 1
    else if (prefixColumns > 0) prefixColumns
    else keySchema.length

  private val keyFields = keySchema.length
  private val valueFields = valueSchema.length
  private val hashOfKey = hashProjection(keySchema, partitionKeyColumns)
  private val hashOfPrefix =
    if (prefixColumns > 0) hashProjection(StructType(keySchema.take(prefixColumns)), prefixColumns) else null
  private val prefixOfKey =
    if (prefixColumns > 0) UnsafeProjection.create(
      keySchema.take(prefixColumns).zipWithIndex.map { case (f, i) => BoundReference(i, f.dataType, f.nullable) }.toSeq)
    else null

  private def hashProjection(schema: StructType, columns: Int): UnsafeRow => Int =
    if (columns == 0) (_: UnsafeRow) => 42
    else {
      val refs = (0 until columns).map(i => BoundReference(i, schema(i).dataType, schema(i).nullable))
      val projection = UnsafeProjection.create(Seq(Murmur3Hash(refs, 42)))
      (row: UnsafeRow) => projection(row).getInt(0)
    }

  /** What offline tools need to know of this layout (recorded in snapshot manifests). */
  val layout: KeyLayout = KeyLayout(keySchema.length, partitionKeyColumns, prefixColumns)

  def keyGroupOf(hash: Int): Int = KeyGroups.keyGroupOf(hash, keyGroups)

  def encodeKey(key: UnsafeRow): Array[Byte] = {
    val group = keyGroupOf(hashOfKey(key))
    if (prefixColumns == 0) {
      val out = new Array[Byte](4 + key.getSizeInBytes)
      putInt(out, 0, group)
      copyRow(key, out, 4)
      out
    } else {
      val prefix = prefixOfKey(key)
      val out = new Array[Byte](8 + prefix.getSizeInBytes + key.getSizeInBytes)
      putInt(out, 0, group)
      putInt(out, 4, prefix.getSizeInBytes)
      copyRow(prefix, out, 8)
      copyRow(key, out, 8 + prefix.getSizeInBytes)
      out
    }
  }

  /** The stored-key prefix shared by every key whose leading columns equal `prefixKey`. */
  def encodePrefix(prefixKey: UnsafeRow): Array[Byte] = {
    require(prefixColumns > 0, "prefixScan needs a PrefixKeyScanStateEncoderSpec")
    val out = new Array[Byte](8 + prefixKey.getSizeInBytes)
    putInt(out, 0, keyGroupOf(hashOfPrefix(prefixKey)))
    putInt(out, 4, prefixKey.getSizeInBytes)
    copyRow(prefixKey, out, 8)
    out
  }

  /** Where the key's row starts in its stored key. */
  def keyRowOffset(stored: Array[Byte]): Int = if (prefixColumns == 0) 4 else 8 + ByteBuffer.wrap(stored, 4, 4).getInt()

  def decodeKey(stored: Array[Byte]): UnsafeRow = {
    val offset = keyRowOffset(stored)
    val row = new UnsafeRow(keyFields)
    row.pointTo(stored, Platform.BYTE_ARRAY_OFFSET + offset, stored.length - offset)
    row
  }

  /** A plain value (format 1); [[KeyCodec.withWriteTime]] turns it into a timed one. */
  def encodeValue(value: UnsafeRow): Array[Byte] = {
    val out = new Array[Byte](1 + value.getSizeInBytes)
    out(0) = KeyCodec.PlainValue
    copyRow(value, out, 1)
    out
  }

  def decodeValue(stored: Array[Byte]): UnsafeRow = {
    val offset = stored(0) match {
      case KeyCodec.PlainValue => 1
      case KeyCodec.TimedValue => 9
      case other => throw new IllegalStateException(s"keyedstate: unknown value format $other in store $storeName")
    }
    val row = new UnsafeRow(valueFields)
    row.pointTo(stored, Platform.BYTE_ARRAY_OFFSET + offset, stored.length - offset)
    row
  }

  private lazy val joinKeyOfIndexKey = UnsafeProjection.create(
    keySchema.take(keyFields - 1).zipWithIndex.map { case (f, i) => BoundReference(i, f.dataType, f.nullable) }.toSeq)

  /**
   * For a join's keyWithIndexToValue store: the stored key of the join key's count in the
   * sibling keyToNumValues store (same key group: both hash the join key), and the index.
   */
  def countKeyAndIndex(stored: Array[Byte]): (Array[Byte], Long) = {
    require(prefixColumns == 0 && partitionKeyColumns == keyFields - 1, s"store $storeName is not a join index store")
    val row = decodeKey(stored)
    val joinKey = joinKeyOfIndexKey(row)
    val out = new Array[Byte](4 + joinKey.getSizeInBytes)
    System.arraycopy(stored, 0, out, 0, 4)
    copyRow(joinKey, out, 4)
    (out, row.getLong(keyFields - 1))
  }

  private def copyRow(row: UnsafeRow, out: Array[Byte], offset: Int): Unit =
    Platform.copyMemory(row.getBaseObject, row.getBaseOffset, out,
      Platform.BYTE_ARRAY_OFFSET + offset, row.getSizeInBytes)

  private def putInt(out: Array[Byte], offset: Int, v: Int): Unit = {
    out(offset) = (v >>> 24).toByte
    out(offset + 1) = (v >>> 16).toByte
    out(offset + 2) = (v >>> 8).toByte
    out(offset + 3) = v.toByte
  }
}

object KeyCodec {
  val PlainValue: Byte = 1
  val TimedValue: Byte = 2

  /** The same value stamped with a write time (format 2), from a plain or a timed one. */
  def withWriteTime(stored: Array[Byte], writtenAtMs: Long): Array[Byte] = {
    val row = if (stored(0) == TimedValue) 9 else 1
    val out = new Array[Byte](9 + stored.length - row)
    out(0) = TimedValue
    var i = 0
    while (i < 8) { out(1 + i) = (writtenAtMs >>> (56 - 8 * i)).toByte; i += 1 }
    System.arraycopy(stored, row, out, 9, stored.length - row)
    out
  }

  def writtenAt(stored: Array[Byte]): Long = {
    var v = 0L
    var i = 1
    while (i < 9) { v = (v << 8) | (stored(i) & 0xFF); i += 1 }
    v
  }
}
