package io.keyedstate.engine

import java.util.concurrent.ConcurrentHashMap

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.TaskContext
import org.slf4j.LoggerFactory

/**
 * The default clock: one value per micro-batch, the batch timestamp Spark recorded in the offset
 * log (`offsets/<batchId>`; a store opened at version v serves batch v), so every task of a batch,
 * and a re-execution of the batch after a failure, sees the same time. In a query's task (Spark's
 * `sql.streaming.queryId` is set) an offset log that cannot be read fails the task: the wall clock
 * would give a re-execution another "now". Outside a query (e.g. the state data source) it is the
 * wall clock. Read once per JVM, query and batch: a checkpoint deleted and created again under
 * the same path is another query (its id is in the checkpoint), not the old one's batches.
 */
final class BatchTimestampClock(queryRoot: Path, hadoopConf: Configuration) extends TtlClock {
  import BatchTimestampClock._

  override def now(version: Long): Long = {
    val query = Option(TaskContext.get()).flatMap(tc => Option(tc.getLocalProperty(QueryIdKey)))
    val key = s"${query.getOrElse("")}/$queryRoot/$version"
    Option(cache.get(key)).map(_.longValue()).orElse {
      val ts = try SparkMetadata.batchTimestamp(queryRoot, version, hadoopConf) catch {
        case NonFatal(e) if query.isDefined =>
          throw new java.io.IOException(s"keyedstate: cannot read the batch timestamp of batch $version (TTL's now) " +
            s"from ${new Path(new Path(queryRoot, "offsets"), version.toString)}: ${e.getMessage}", e)
        case NonFatal(e) =>
          log.warn(s"keyedstate: cannot read the batch timestamp of batch $version under $queryRoot; TTL uses the " +
            "wall clock", e)
          None
      }
      ts match {
        case Some(t) =>
          if (cache.size > 10000) cache.clear()
          cache.put(key, t)
        case None if query.isDefined =>
          log.warn(s"keyedstate: no batch timestamp for batch $version under $queryRoot; TTL uses the wall clock")
        case None =>
      }
      ts
    }.getOrElse(System.currentTimeMillis())
  }
}

object BatchTimestampClock {
  private val log = LoggerFactory.getLogger(classOf[BatchTimestampClock])
  private val cache = new ConcurrentHashMap[String, java.lang.Long]()
  /** Spark's StreamExecution.QUERY_ID_KEY: a local property of every task of a query (Spark
   *  4.3's tasks do not carry its RUN_ID_KEY). */
  private val QueryIdKey = "sql.streaming.queryId"
}
