package io.keyedstate.engine

import io.keyedstate.format.{ChangelogFormat, SplitChangelog}

/**
 * One version's writes, kept in the JVM until commit so that no write crosses to Python per key:
 * the last value of each key (reads consult it first, so a version sees its own writes), and the
 * version's changelog, encoded as the writes happen (Spark's changelog writer does the same) and
 * held split as changelog codec 2 compresses it, so that a commit only has to finish, compress
 * and publish it, with no copy of the whole changelog. Each record carries what was known
 * of the key just before it ([[ChangelogFormat]]'s ops, sequential: a key written twice is new
 * the first time and existing the second).
 */
final class WriteBuffer(version: Long, keyGroups: Int, expected: WriteBuffer.Expected) {
  import WriteBuffer._

  def this(version: Long, keyGroups: Int) = this(version, keyGroups, WriteBuffer.Expected.None)

  // Pages from 4 KiB, doubling: a batch of a few writes stays small.
  private var pagesMade = 0
  private val entries = new BytesMap(() => { pagesMade += 1; 4096 << math.min(pagesMade - 1, 6) }, expected.keys)
  private lazy val log = new ChangelogFormat.InMemoryWriter(version, keyGroups, expected.logBytes, expected.keys) // read stores never write
  /** Net keys added by the logged records (new keys minus deleted ones), where known. */
  var keyDelta = 0L
  /** Records whose key's previous existence was unknown (the reader has to look). */
  var unknownOps = 0L

  /** Records a put; `op` says what was known of the key before it (0: nothing to log). */
  def put(key: Bytes, value: Array[Byte], op: Byte): Unit = {
    entries.put(key.bytes, key.hashCode, value)
    if (entries.wasteful) entries.compact() // a key rewritten with values of changing sizes
    if (op != 0) { log.writer.put(op, key.bytes, value); count(op) }
  }

  /** Records a delete; `op` as for [[put]] (0: the key was known to be absent, nothing to log). */
  def delete(key: Bytes, op: Byte): Unit = {
    entries.put(key.bytes, key.hashCode, Tombstone)
    if (op != 0) { log.writer.delete(op, key.bytes); count(op) }
  }

  private def count(op: Byte): Unit = op match {
    case ChangelogFormat.OpPutNew => keyDelta += 1
    case ChangelogFormat.OpDeleteExisting => keyDelta -= 1
    case ChangelogFormat.OpPut | ChangelogFormat.OpDelete => unknownOps += 1
    case _ =>
  }

  /** Whether this version wrote `key`: [[BytesMap.Missing]], [[BytesMap.Deleted]] or [[BytesMap.Present]]. */
  def presence(key: Bytes): Int = entries.presence(key.bytes, key.hashCode)
  /** The pending value: null = not written in this version; [[Tombstone]] = deleted. */
  def lookup(key: Bytes): Array[Byte] = entries.get(key.bytes, key.hashCode)
  /** Keys written in this version. */
  def size: Int = entries.size
  /** Memory of the last values alone (what a copy of them into another BytesMap takes, about). */
  def entryBytes: Long = entries.memoryBytes
  def estimatedBytes: Long = entries.memoryBytes + (if (entries.size == 0) 0L else log.writer.bytesWritten)
  def recordCount: Long = if (entries.size == 0) 0L else log.writer.recordCount
  /** What the next version should expect (the last version's size is the best guess). */
  def observed: Expected = Expected(entries.size, if (entries.size == 0) 0L else log.writer.bytesWritten)

  /** The version's changelog, finished (held split, as codec 2 compresses it); the buffer takes
   *  no writes after this. */
  def finish(): SplitChangelog = log.finish()

  /** Every key written in this version with its last value ([[Tombstone]] for a delete). */
  def foreachWrite(f: (Bytes, Array[Byte]) => Unit): Unit = entries.foreach((k, v) => f(new Bytes(k), v))

  /** A point-in-time copy of the last values, so iterators tolerate removes made while they run. */
  def snapshot(): Array[(Bytes, Array[Byte])] = {
    entries.toArray.map { case (k, v) => (new Bytes(k), v) }
  }

  def clear(): Unit = entries.clear()
}

object WriteBuffer {
  /** A delete; compared by identity. */
  val Tombstone: Array[Byte] = new Array[Byte](0)

  /** Sizes to allocate up front: keys written and changelog bytes (slightly more than seen). */
  final case class Expected(keys: Int, logBytes: Long) {
    /** A little more than seen, capped (1M keys, 32 MB): one huge batch (a seed) must not make
     *  the next, ordinary one allocate as much up front; beyond the cap they grow as they go. */
    def grown: Expected = Expected(math.min(keys + keys / 8, 1 << 20), math.min(logBytes + logBytes / 8 + 4096, 32L << 20))
  }
  object Expected { val None: Expected = Expected(0, 0) }
}
