package io.keyedstate.engine

import java.io.IOException

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import io.keyedstate.checkpoint.{CheckpointFiles, CheckpointReads}
import io.keyedstate.format.CheckpointLayout

/**
 * What the engine reads of Spark's own checkpoint files (the offline tools' twin is
 * `keyedstate/checkpoint/spark.py`). Executors have no SparkSession, so Spark's
 * OffsetSeqLog cannot be used here; both files start with a version line and then JSON.
 */
object SparkMetadata {
  private val Json = new ObjectMapper()

  /** `batchTimestampMs` of `offsets/<batch>` under `queryRoot`; None when absent. */
  def batchTimestamp(queryRoot: Path, batch: Long, hadoopConf: Configuration): Option[Long] = {
    val offsets = new Path(new Path(queryRoot, "offsets"), batch.toString)
    val fs = offsets.getFileSystem(hadoopConf)
    if (!fs.exists(offsets)) None
    else readText(offsets, hadoopConf).linesIterator.toSeq.lift(1).map(parse(_, offsets)).map(_.path("batchTimestampMs"))
      .filter(_.isNumber).map(_.asLong())
  }

  /** operator id -> (operator name, store names), from `state/<op>/_metadata/metadata` (v1). */
  def operators(stateRoot: Path, hadoopConf: Configuration): Map[Int, (String, Seq[String])] = {
    val fs = stateRoot.getFileSystem(hadoopConf)
    if (!fs.exists(stateRoot)) return Map.empty
    fs.listStatus(stateRoot).filter(_.isDirectory).flatMap { st =>
      val meta = new Path(new Path(st.getPath, "_metadata"), "metadata")
      st.getPath.getName.toIntOption.filter(_ => fs.exists(meta)).map { op =>
        val json = parse(readText(meta, hadoopConf).linesIterator.drop(1).mkString("\n"), meta)
        val name = json.path("operatorInfo").path("operatorName").asText("?")
        val stores = json.path("stateStoreInfo").elements().asScala.map(_.path("storeName").asText()).toSeq
        op -> (name, stores)
      }
    }.toMap
  }

  /** JSON of Spark's file `path`; a failure names it. */
  private def parse(text: String, path: Path): JsonNode =
    try Json.readTree(text) catch {
      case NonFatal(e) => throw new IOException(s"keyedstate: $path is truncated or corrupt (${e.getMessage})", e)
    }

  /** The text of Spark's file `path`, read as every checkpoint file is ([[CheckpointReads.open]]:
   *  no link, bounded size) and refused unless it is UTF-8. */
  private def readText(path: Path, hadoopConf: Configuration): String = {
    val fs = path.getFileSystem(hadoopConf)
    val opened = CheckpointReads.open(fs, path, withLength = true)(fs.open(_))
    val data = try CheckpointReads.readAll(opened, path, CheckpointFiles.MaxSparkMetadataBytes, "Spark metadata file")
      finally opened.in.close()
    try CheckpointLayout.utf8(data, 0, data.length) catch {
      case NonFatal(e) => throw new IOException(s"keyedstate: $path is truncated or corrupt (${e.getMessage})", e)
    }
  }
}
