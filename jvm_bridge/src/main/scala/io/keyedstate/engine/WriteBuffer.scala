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
final class WriteBuffer(version: Long, keyGroups: Int, expected: WriteBuffer.Expected,
    spare: () => WriteBuffer.Spare = () => WriteBuffer.Spare.None) {
  import WriteBuffer._

  def this(version: Long, keyGroups: Int) = this(version, keyGroups, WriteBuffer.Expected.None)

  // Made at the first write (read stores never write), from the store's last version's arrays
  // when it handed them over ([[handOver]]); null again once this version's are handed over.
  private var entries: BytesMap = _
  private var log: ChangelogFormat.InMemoryWriter = _
  private var finished: SplitChangelog = _
  private var handedOver = false
  /** Net keys added by the logged records (new keys minus deleted ones), where known. */
  var keyDelta = 0L
  /** Records whose key's previous existence was unknown (the reader has to look). */
  var unknownOps = 0L

  private def writing(): BytesMap = {
    if (entries == null) {
      if (handedOver) throw new IllegalStateException(s"keyedstate: version ${version - 1}'s writes were committed; it takes no more")
      val s = spare()
      entries = s.entries.getOrElse(new BytesMap(doublingPages(), expected.keys))
      log = new ChangelogFormat.InMemoryWriter(version, keyGroups, expected.logBytes, expected.keys, s.changelog)
    }
    entries
  }

  /** Records a put; `op` says what was known of the key before it (0: nothing to log). */
  def put(key: Bytes, value: Array[Byte], op: Byte): Unit = {
    val entries = writing()
    entries.put(key.bytes, key.hashCode, value)
    if (entries.wasteful) entries.compact() // a key rewritten with values of changing sizes
    if (op != 0) { log.writer.put(op, key.bytes, value); count(op) }
  }

  /** Records a delete; `op` as for [[put]] (0: the key was known to be absent, nothing to log). */
  def delete(key: Bytes, op: Byte): Unit = {
    writing().put(key.bytes, key.hashCode, Tombstone)
    if (op != 0) { log.writer.delete(op, key.bytes); count(op) }
  }

  private def count(op: Byte): Unit = op match {
    case ChangelogFormat.OpPutNew => keyDelta += 1
    case ChangelogFormat.OpDeleteExisting => keyDelta -= 1
    case ChangelogFormat.OpPut | ChangelogFormat.OpDelete => unknownOps += 1
    case _ =>
  }

  /** Whether this version wrote `key`: [[BytesMap.Missing]], [[BytesMap.Deleted]] or [[BytesMap.Present]]. */
  def presence(key: Bytes): Int = if (entries == null) BytesMap.Missing else entries.presence(key.bytes, key.hashCode)
  /** The pending value: null = not written in this version; [[Tombstone]] = deleted. */
  def lookup(key: Bytes): Array[Byte] = if (entries == null) null else entries.get(key.bytes, key.hashCode)
  /** Keys written in this version. */
  def size: Int = if (entries == null) 0 else entries.size
  def estimatedBytes: Long = if (entries == null) 0L else entries.memoryBytes + (if (entries.size == 0) 0L else log.writer.bytesWritten)
  def recordCount: Long = if (size == 0) 0L else log.writer.recordCount
  /** What the next version should expect (the last version's size is the best guess). */
  def observed: Expected = Expected(size, if (size == 0) 0L else log.writer.bytesWritten)

  /** The version's changelog, finished (held split, as codec 2 compresses it); the buffer takes
   *  no writes after this. */
  def finish(): SplitChangelog = {
    writing()
    finished = log.finish()
    finished
  }

  /**
   * Once the commit has compressed and shipped [[finish]]'s changelog: this version's map
   * (emptied, keeping its pages and index) and changelog arrays for the store's next version,
   * so that a batch does not allocate again what the last one dropped (a changelog array of
   * ~11 MB and a map of ~18 MB a partition on W1, every batch). Parts above [[MaxSpareBytes]]
   * (a seed's) are let go rather than held between batches. The buffer holds nothing after it.
   */
  def handOver(): Spare = {
    require(finished != null, "keyedstate: a write buffer hands over its arrays only after its changelog is finished")
    val map = entries
    val arrays = finished.arrays
    entries = null; log = null; finished = null; handedOver = true
    Spare(Option(map).filter(_.memoryBytes <= MaxSpareBytes).map { m => m.reuse(); m },
      Some(arrays).filter(_.bytes <= MaxSpareBytes))
  }

  /** Every key written in this version with its last value ([[Tombstone]] for a delete). */
  def foreachWrite(f: (Bytes, Array[Byte]) => Unit): Unit =
    if (entries != null) entries.foreach((k, v) => f(new Bytes(k), v))

  /** A point-in-time copy of the last values, so iterators tolerate removes made while they run. */
  def snapshot(): Array[(Bytes, Array[Byte])] =
    if (entries == null) Array.empty else entries.toArray.map { case (k, v) => (new Bytes(k), v) }

  def clear(): Unit = if (entries != null) entries.clear()
}

object WriteBuffer {
  /** A delete; compared by identity. */
  val Tombstone: Array[Byte] = new Array[Byte](0)

  /** The most a store keeps of each part of a committed version's buffer for the next one. */
  val MaxSpareBytes: Long = 64L << 20

  /** What a committed version leaves its store's next one ([[WriteBuffer.handOver]]). */
  final case class Spare(entries: Option[BytesMap], changelog: Option[SplitChangelog.Arrays]) {
    def bytes: Long = entries.map(_.memoryBytes).getOrElse(0L) + changelog.map(_.bytes).getOrElse(0L)
  }
  object Spare { val None: Spare = Spare(scala.None, scala.None) }

  /** Page sizes from 4 KiB, doubling up to 256 KiB: a batch of a few writes stays small. */
  private def doublingPages(): () => Int = {
    var made = 0
    () => { made += 1; 4096 << math.min(made - 1, 6) }
  }

  /** Sizes to allocate up front: keys written and changelog bytes (slightly more than seen). */
  final case class Expected(keys: Int, logBytes: Long) {
    /** A little more than seen, capped (1M keys, 32 MB): one huge batch (a seed) must not make
     *  the next, ordinary one allocate as much up front; beyond the cap they grow as they go. */
    def grown: Expected = Expected(math.min(keys + keys / 8, 1 << 20), math.min(logBytes + logBytes / 8 + 4096, 32L << 20))
  }
  object Expected { val None: Expected = Expected(0, 0) }
}
