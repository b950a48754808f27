package io.keyedstate.engine

import java.util.concurrent.ConcurrentHashMap

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.slf4j.LoggerFactory

/** "Now" for TTL, per version: injected into the engine (Flink's TtlTimeProvider). */
trait TtlClock {
  /** The time of the batch that writes version `version + 1` on top of `version`, epoch ms. */
  def now(version: Long): Long
}

/**
 * The default clock: one value per micro-batch, the batch timestamp Spark recorded in the offset
 * log (`offsets/<batchId>`; a store opened at version v serves batch v), so every task of a batch,
 * and a re-execution of the batch after a failure, sees the same time. Outside a micro-batch
 * (e.g. the state data source) it is the wall clock.
 */
final class BatchTimestampClock(queryRoot: Path, hadoopConf: Configuration) extends TtlClock {
  import BatchTimestampClock._

  override def now(version: Long): Long = {
    val key = s"$queryRoot/$version"
    Option(cache.get(key)).map(_.longValue()).orElse {
      try {
        val ts = SparkMetadata.batchTimestamp(queryRoot, version, hadoopConf)
        ts.foreach { t =>
          if (cache.size > 10000) cache.clear()
          cache.put(key, t)
        }
        ts
      } catch {
        case NonFatal(e) =>
          log.warn(s"keyedstate: cannot read the batch timestamp of batch $version under $queryRoot; TTL uses the " +
            "wall clock", e)
          None
      }
    }.getOrElse(System.currentTimeMillis())
  }
}

object BatchTimestampClock {
  private val log = LoggerFactory.getLogger(classOf[BatchTimestampClock])
  private val cache = new ConcurrentHashMap[String, java.lang.Long]()
}

/** A clock a test sets by hand. */
final class ManualClock(@volatile var nowMs: Long) extends TtlClock {
  override def now(version: Long): Long = nowMs
  def set(ms: Long): Unit = nowMs = ms
  def advance(ms: Long): Unit = nowMs += ms
}

/**
 * Which clock a new store gets. Tests of this JVM install a [[ManualClock]] through
 * [[TtlClocks.installForTesting]] (reachable only from JVM code, e.g. py4j in a test; no Spark
 * conf can select it); it is logged, and every store opened while it is installed uses it.
 */
object TtlClocks {
  private val log = LoggerFactory.getLogger(getClass)
  @volatile private var testClock: TtlClock = _

  def forQuery(queryRoot: Path, hadoopConf: Configuration): TtlClock = {
    val test = testClock
    if (test != null) {
      log.warn("keyedstate: TTL time comes from a test clock, not from the batch timestamps")
      test
    } else new BatchTimestampClock(queryRoot, hadoopConf)
  }

  def installForTesting(startMs: Long): ManualClock = {
    val clock = new ManualClock(startMs)
    testClock = clock
    clock
  }

  def uninstallForTesting(): Unit = testClock = null
}
