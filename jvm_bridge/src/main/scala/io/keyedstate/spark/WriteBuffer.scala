package io.keyedstate.spark

import java.nio.ByteBuffer
import java.util.{Arrays, HashMap => JHashMap}
import java.util.zip.CRC32

/** A byte-array key with value semantics, for hashing encoded keys. */
final class Bytes(val bytes: Array[Byte]) {
  override val hashCode: Int = Arrays.hashCode(bytes)
  override def equals(other: Any): Boolean = other match {
    case b: Bytes => Arrays.equals(bytes, b.bytes)
    case _ => false
  }
}

object Bytes {
  /** Whether `key` starts with `prefix` (scans by key prefix, in the cache and natively). */
  def startsWith(key: Array[Byte], prefix: Array[Byte]): Boolean =
    key.length >= prefix.length && Arrays.equals(key, 0, prefix.length, prefix, 0, prefix.length)
}

/**
 * One version's pending writes, deduplicated per key (last write wins), kept in the JVM until
 * commit so that no write crosses to Python per key. Reads consult it first, so a version
 * sees its own writes. At commit it becomes one changelog (format: `keyedstate/changelog.py`).
 */
final class WriteBuffer {
  import WriteBuffer._

  private val entries = new JHashMap[Bytes, Array[Byte]]()
  private var bytesHeld = 0L

  def put(key: Bytes, value: Array[Byte]): Unit = track(entries.put(key, value), key, value)
  def delete(key: Bytes): Unit = track(entries.put(key, Tombstone), key, Tombstone)

  private def track(previous: Array[Byte], key: Bytes, value: Array[Byte]): Unit = {
    if (previous == null) bytesHeld += key.bytes.length + 48 else bytesHeld -= previous.length
    bytesHeld += value.length
  }

  /** The pending value: null = not written in this version; [[Tombstone]] = deleted. */
  def lookup(key: Bytes): Array[Byte] = entries.get(key)
  def size: Int = entries.size
  def estimatedBytes: Long = bytesHeld
  def clear(): Unit = { entries.clear(); bytesHeld = 0 }
  def foreach(f: (Bytes, Array[Byte]) => Unit): Unit = entries.forEach((k, v) => f(k, v))

  /** A point-in-time copy, so iterators tolerate removes made while they run. */
  def snapshot(): Array[(Bytes, Array[Byte])] = {
    val out = new Array[(Bytes, Array[Byte])](entries.size)
    var i = 0
    entries.forEach { (k, v) => out(i) = (k, v); i += 1 }
    out
  }

  /**
   * Encodes the buffered writes as the changelog that produces `version`. `classify` gives
   * each write its op code (what is known of the key's previous existence), or 0 to drop it
   * (deleting a key known to be absent changes nothing).
   */
  def toChangelog(version: Long, keyGroups: Int, classify: (Bytes, Array[Byte]) => Byte): ByteBuffer = {
    val n = entries.size
    val keys = new Array[Bytes](n)
    val values = new Array[Array[Byte]](n)
    val ops = new Array[Byte](n)
    var kept = 0
    var size = HeaderBytes + TrailerBytes
    entries.forEach { (k, v) =>
      val op = classify(k, v)
      if (op != 0) {
        keys(kept) = k; values(kept) = v; ops(kept) = op; kept += 1
        size += 5 + k.bytes.length + (if (v eq Tombstone) 0 else 4 + v.length)
      }
    }
    if (size > Int.MaxValue - 64) {
      throw new IllegalStateException(s"keyedstate: version $version writes $size bytes; at most 2 GB per commit")
    }
    val buf = ByteBuffer.allocate(size.toInt)
    buf.put(Magic).putShort(FormatVersion.toShort).putLong(version).putInt(keyGroups)
    var i = 0
    while (i < kept) {
      val k = keys(i).bytes
      buf.put(ops(i)).putInt(k.length).put(k)
      val v = values(i)
      if (!(v eq Tombstone)) buf.putInt(v.length).put(v)
      i += 1
    }
    val crc = new CRC32()
    crc.update(buf.array(), 0, buf.position())
    buf.put(End).putLong(kept.toLong).putInt(crc.getValue.toInt)
    buf.flip()
    buf
  }
}

object WriteBuffer {
  val Tombstone: Array[Byte] = new Array[Byte](0)
  val Magic: Array[Byte] = "KSCHLOG1".getBytes("US-ASCII")
  val FormatVersion = 1
  private val HeaderBytes = 8L + 2 + 8 + 4
  private val TrailerBytes = 1L + 8 + 4
  val End: Byte = 0xFF.toByte
  // Record ops (see keyedstate/changelog.py).
  val OpPut: Byte = 1
  val OpDelete: Byte = 2
  val OpPutNew: Byte = 3
  val OpPutExisting: Byte = 4
  val OpDeleteExisting: Byte = 5

  /** Refines an op whose key's previous existence was unknown with what a read learnt (or null). */
  def settle(op: Byte, existed: java.lang.Boolean): Byte =
    if (existed == null) op
    else if (op == OpPut) { if (existed) OpPutExisting else OpPutNew }
    else if (op == OpDelete) { if (existed) OpDeleteExisting else 0.toByte }
    else op
}
