package io.keyedstate.engine

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.slf4j.LoggerFactory

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
