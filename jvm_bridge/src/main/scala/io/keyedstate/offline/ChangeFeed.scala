package io.keyedstate.offline

import org.apache.spark.keyedstate.ChangeIterator
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.RecordType

import io.keyedstate.checkpoint.{CheckpointFileException, CheckpointFiles}
import io.keyedstate.format.{ChangelogFormat, CorruptChangelogException, KeyCodec}

/**
 * The change feed of one store partition (Spark's `readChangeFeed` of the state data source):
 * every record of the changelogs of versions `startVersion..endVersion`, in order, as
 * `(record type, key, value, batch id = version - 1)`. Puts are `PUT_RECORD` ("update", for
 * new and existing keys alike, as Spark's RocksDB provider reports them), deletes
 * `DELETE_RECORD` with a null value. Keys and values are the rows Spark stored (key group,
 * prefix and value-format header stripped by [[KeyCodec]]); every row is fresh (Spark wraps them
 * without copying).
 *
 * keyedstate logs one record per key and version (a version's writes are deduplicated before
 * they are logged) and logs no delete of a key that did not exist; Spark's RocksDB provider logs
 * every call. For the operators Spark lets a custom provider serve, each key is written at most
 * once per batch, so the feeds agree row for row.
 *
 * Checkpoint format 2: the versions' unique ids come from the lineage that each changelog's
 * header records, walked back from `(endVersion, endId)`.
 *
 * A rescale's version ([[Rescales]]) changes no value: a feed starting at its batch has no rows
 * for it. A feed starting before it is refused: Spark opens only the partitions of
 * `changeEndBatchId`'s count, so the changes a scale-down's retired partitions logged before it
 * would be missing without a word.
 */
final class ChangeFeed(files: CheckpointFiles, codec: KeyCodec, startVersion: Long, endVersion: Long,
    endId: Option[String], describe: String)
  extends ChangeIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] {

  if (startVersion < 1 || endVersion < startVersion) {
    throw new IllegalArgumentException(s"keyedstate: the change feed of $describe needs 1 <= start version " +
      s"($startVersion) <= end version ($endVersion): changeStartBatchId must be >= 0 and <= changeEndBatchId")
  }

  private val versions: List[(Long, Option[String])] = endId match {
    case None =>
      val rescales = Rescales.within(files, files.listing(), startVersion, endVersion)
      rescales.filter(_.version > startVersion).lastOption.foreach { r =>
        Rescales.refuseSpanning("changeStartBatchId", startVersion - 1, r, describe,
          s"a change feed cannot span a rescale (read up to changeEndBatchId ${r.batch - 1} separately)")
      }
      ChangeFeed.chain(files, startVersion, endVersion, endId).filterNot(v => rescales.exists(_.version == v._1))
    case Some(_) => ChangeFeed.chain(files, startVersion, endVersion, endId) // rescale runs on format 1 only
  }
  private var pending = versions
  private var records: Iterator[ChangelogFormat.Record] = Iterator.empty
  private var batchId = -1L

  override protected def advance(): Option[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] = {
    while (!records.hasNext) {
      if (pending.isEmpty) return None
      val (v, id) = pending.head
      pending = pending.tail
      val path = files.changelog(v, id)
      if (!files.exists(path)) throw ChangeFeed.missing(path, v, describe)
      records = try ChangelogFormat.read(files.readBytes(path, CheckpointFiles.MaxChangelogBytes, "changelog"), path.toString).iterator catch {
        case e: CorruptChangelogException => throw new CheckpointFileException(s"keyedstate: ${e.getMessage}", e)
      }
      batchId = v - 1
    }
    val r = try records.next() catch {
      case e: CorruptChangelogException => throw new CheckpointFileException(s"keyedstate: ${e.getMessage}", e)
    }
    val key = codec.decodeKey(r.key)
    Some(if (r.value == null) (RecordType.DELETE_RECORD, key, null, batchId)
    else (RecordType.PUT_RECORD, key, codec.decodeValue(r.value), batchId))
  }

  override protected def release(): Unit = { records = Iterator.empty; pending = Nil }
}

object ChangeFeed {
  /** (version, unique id) of `start..end`, oldest first. */
  def chain(files: CheckpointFiles, start: Long, end: Long, endId: Option[String]): List[(Long, Option[String])] =
    endId match {
      case None => (start to end).map(v => v -> Option.empty[String]).toList
      case Some(_) =>
        var chain = List(end -> endId)
        while (chain.head._1 > start) {
          val (v, id) = chain.head
          val older = files.readChangelogMeta(v, id).lineage.filter(_._1 < v).sortBy(-_._1)
          if (older.isEmpty || older.head._1 != v - 1) {
            throw new CheckpointFileException(s"keyedstate: ${files.changelog(v, id)} records no lineage back to " +
              s"version ${v - 1} (it records ${older.mkString(", ")}): corrupt, or written by another tool")
          }
          older.takeWhile(_._1 >= start).foreach { case (ov, oid) =>
            if (ov == chain.head._1 - 1) chain = (ov -> Option(oid)) :: chain
          }
        }
        chain
    }

  def missing(path: org.apache.hadoop.fs.Path, version: Long, describe: String) = new CheckpointFileException(
    s"keyedstate: the change feed of $describe needs $path (batch ${version - 1}), which is not in the checkpoint: " +
      "its batch is older than the retained ones (spark.sql.streaming.minBatchesToRetain); start the feed at a " +
      "later changeStartBatchId")
}
