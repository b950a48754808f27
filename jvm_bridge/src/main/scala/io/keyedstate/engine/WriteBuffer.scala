package io.keyedstate.engine

import java.nio.ByteBuffer
import java.util.{HashMap => JHashMap}

import io.keyedstate.format.ChangelogFormat

/**
 * One version's writes, kept in the JVM until commit so that no write crosses to Python per key:
 * the last value of each key (reads consult it first, so a version sees its own writes), and the
 * version's changelog, encoded as the writes happen (Spark's changelog writer does the same), so
 * that a commit only has to finish, compress and publish it. Each record carries what was known
 * of the key just before it ([[ChangelogFormat]]'s ops, sequential: a key written twice is new
 * the first time and existing the second).
 */
final class WriteBuffer(version: Long, keyGroups: Int) {
  import WriteBuffer._

  private val entries = new JHashMap[Bytes, Array[Byte]]()
  private var bytesHeld = 0L
  private lazy val log = new ChangelogFormat.InMemoryWriter(version, keyGroups) // read stores never write
  /** Net keys added by the logged records (new keys minus deleted ones), where known. */
  var keyDelta = 0L
  /** Records whose key's previous existence was unknown (the reader has to look). */
  var unknownOps = 0L

  /** Records a put; `op` says what was known of the key before it (0: nothing to log). */
  def put(key: Bytes, value: Array[Byte], op: Byte): Unit = {
    track(entries.put(key, value), key, value)
    if (op != 0) { log.writer.put(op, key.bytes, value); count(op) }
  }

  /** Records a delete; `op` as for [[put]] (0: the key was known to be absent, nothing to log). */
  def delete(key: Bytes, op: Byte): Unit = {
    track(entries.put(key, Tombstone), key, Tombstone)
    if (op != 0) { log.writer.delete(op, key.bytes); count(op) }
  }

  private def count(op: Byte): Unit = op match {
    case ChangelogFormat.OpPutNew => keyDelta += 1
    case ChangelogFormat.OpDeleteExisting => keyDelta -= 1
    case ChangelogFormat.OpPut | ChangelogFormat.OpDelete => unknownOps += 1
    case _ =>
  }

  private def track(previous: Array[Byte], key: Bytes, value: Array[Byte]): Unit = {
    if (previous == null) bytesHeld += key.bytes.length + EntryOverhead else bytesHeld -= previous.length
    bytesHeld += value.length
  }

  /** The pending value: null = not written in this version; [[Tombstone]] = deleted. */
  def lookup(key: Bytes): Array[Byte] = entries.get(key)
  /** Keys written in this version. */
  def size: Int = entries.size
  def estimatedBytes: Long = bytesHeld + (if (entries.isEmpty) 0L else log.writer.bytesWritten)
  def recordCount: Long = if (entries.isEmpty) 0L else log.writer.recordCount

  /** The version's changelog (format 1), finished; the buffer takes no writes after this. */
  def finish(): ByteBuffer = log.finish()

  /** A point-in-time copy of the last values, so iterators tolerate removes made while they run. */
  def snapshot(): Array[(Bytes, Array[Byte])] = {
    val out = new Array[(Bytes, Array[Byte])](entries.size)
    var i = 0
    entries.forEach { (k, v) => out(i) = (k, v); i += 1 }
    out
  }

  def clear(): Unit = { entries.clear(); bytesHeld = 0 }
}

object WriteBuffer {
  /** A delete; compared by identity. */
  val Tombstone: Array[Byte] = new Array[Byte](0)
  private val EntryOverhead = 48L
}
