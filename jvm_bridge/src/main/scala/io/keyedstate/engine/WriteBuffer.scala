package io.keyedstate.engine

import java.util.{HashMap => JHashMap}

/**
 * One version's pending writes, deduplicated per key (last write wins), kept in the JVM until
 * commit so that no write crosses to Python per key. Reads consult it first, so a version sees
 * its own writes. At commit the engine encodes it as the version's changelog.
 */
final class WriteBuffer {
  import WriteBuffer._

  private val entries = new JHashMap[Bytes, Array[Byte]]()
  private var bytesHeld = 0L

  def put(key: Bytes, value: Array[Byte]): Unit = track(entries.put(key, value), key, value)
  def delete(key: Bytes): Unit = track(entries.put(key, Tombstone), key, Tombstone)

  private def track(previous: Array[Byte], key: Bytes, value: Array[Byte]): Unit = {
    if (previous == null) bytesHeld += key.bytes.length + EntryOverhead else bytesHeld -= previous.length
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
}

object WriteBuffer {
  /** A delete; compared by identity. */
  val Tombstone: Array[Byte] = new Array[Byte](0)
  private val EntryOverhead = 48L
}
