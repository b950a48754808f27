package io.keyedstate.spark

import java.io.{ByteArrayOutputStream, DataOutputStream}
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

/**
 * One version's pending writes, deduplicated per key (last write wins), kept in the JVM until
 * commit so that no write crosses to Python per key. Reads consult it first, so a version
 * sees its own writes. At commit it becomes one changelog (format: `keyedstate/changelog.py`).
 */
final class WriteBuffer {
  import WriteBuffer._

  private val entries = new JHashMap[Bytes, Array[Byte]]()
  private var bytesHeld = 0L

  def put(key: Array[Byte], value: Array[Byte]): Unit = track(entries.put(new Bytes(key), value), key, value)
  def delete(key: Array[Byte]): Unit = track(entries.put(new Bytes(key), Tombstone), key, Tombstone)

  private def track(previous: Array[Byte], key: Array[Byte], value: Array[Byte]): Unit = {
    if (previous == null) bytesHeld += key.length + 48 else bytesHeld -= previous.length
    bytesHeld += value.length
  }

  /** The pending value: null = not written in this version; [[Tombstone]] = deleted. */
  def lookup(key: Array[Byte]): Array[Byte] = entries.get(new Bytes(key))
  def size: Int = entries.size
  def isEmpty: Boolean = entries.isEmpty
  def estimatedBytes: Long = bytesHeld
  def clear(): Unit = { entries.clear(); bytesHeld = 0 }

  /** A point-in-time copy, so iterators tolerate removes made while they run. */
  def snapshot(): Array[(Array[Byte], Array[Byte])] = {
    val out = new Array[(Array[Byte], Array[Byte])](entries.size)
    var i = 0
    entries.forEach { (k, v) => out(i) = (k.bytes, v); i += 1 }
    out
  }

  /** Encodes the buffered writes as the changelog that produces `version`. */
  def toChangelog(version: Long, keyGroups: Int): ByteBuffer = {
    val bytes = new ByteArrayOutputStream(math.min(Int.MaxValue - 64, bytesHeld + 64).toInt)
    val out = new DataOutputStream(bytes)
    out.write(Magic)
    out.writeShort(FormatVersion)
    out.writeLong(version)
    out.writeInt(keyGroups)
    entries.forEach { (k, v) =>
      if (v eq Tombstone) {
        out.writeByte(OpDelete); out.writeInt(k.bytes.length); out.write(k.bytes)
      } else {
        out.writeByte(OpPut); out.writeInt(k.bytes.length); out.write(k.bytes)
        out.writeInt(v.length); out.write(v)
      }
    }
    out.flush()
    val crc = new CRC32()
    val body = bytes.toByteArray
    crc.update(body)
    val buf = ByteBuffer.allocate(body.length + 13)
    buf.put(body).put(End).putLong(entries.size.toLong).putInt(crc.getValue.toInt).flip()
    buf
  }
}

object WriteBuffer {
  val Tombstone: Array[Byte] = new Array[Byte](0)
  val Magic: Array[Byte] = "KSCHLOG1".getBytes("US-ASCII")
  val FormatVersion = 1
  val OpPut = 1
  val OpDelete = 2
  val End: Byte = 0xFF.toByte
}
