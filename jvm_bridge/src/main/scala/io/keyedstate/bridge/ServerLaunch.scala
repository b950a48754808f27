package io.keyedstate.bridge

import scala.util.control.NonFatal

/** How to start a state server: the JVM-side knobs, read before Python exists. */
final case class ServerLaunch(
    pythonExec: String,
    localDir: Option[String],
    startupTimeoutMs: Long,
    callTimeoutMs: Int,
    processes: Int,
    idleTimeoutMs: Long) {
  def this(pythonExec: String, localDir: Option[String], startupTimeoutMs: Long, callTimeoutMs: Int, processes: Int) =
    this(pythonExec, localDir, startupTimeoutMs, callTimeoutMs, processes, ServerLaunch.DefaultIdleTimeoutMs)
}

object ServerLaunch {
  val ConfPrefix = "spark.sql.streaming.stateStore.keyedstate."
  val DefaultIdleTimeoutMs = 30000L

  /**
   * The launch knobs from the query's keyedstate confs (Python validates every conf again when
   * a store opens). Durations use Spark's own time-string parser, the rule conf.py implements.
   */
  def fromConfs(confs: Map[String, String]): ServerLaunch = {
    val sparkConf = Option(org.apache.spark.SparkEnv.get).map(_.conf)
    val processes = confs.get(ConfPrefix + "serverProcesses").flatMap(_.trim.toIntOption).filter(_ > 0)
      .orElse(sparkConf.flatMap(_.getOption("spark.executor.cores")).flatMap(_.toIntOption))
      .getOrElse(Runtime.getRuntime.availableProcessors())
    ServerLaunch(python(confs), confs.get(ConfPrefix + "localDir"),
      durationMs(confs, "serverStartupTimeout", 60000L),
      math.min(Int.MaxValue.toLong, durationMs(confs, "bridgeTimeout", 600000L)).toInt,
      processes, idleTimeoutMs(confs))
  }

  // The period of the idle-connection cleaner: it must be positive (conf.py refuses 0 too).
  private def idleTimeoutMs(confs: Map[String, String]): Long = {
    val ms = durationMs(confs, "bridgeIdleTimeout", DefaultIdleTimeoutMs)
    if (ms <= 0) throw new IllegalArgumentException(
      s"Invalid value '${confs(ConfPrefix + "bridgeIdleTimeout")}' for conf '${ConfPrefix}bridgeIdleTimeout': " +
        "expected a positive duration such as 500ms, 30s or 15m")
    ms
  }

  /** The Python that runs keyedstate: the query's PySpark workers' first; then our own knob
   *  (which keyedstate.configure() sets to the driver's interpreter); then python3. */
  def python(confs: Map[String, String]): String =
    Option(org.apache.spark.SparkEnv.get).flatMap(_.conf.getOption("spark.pyspark.python"))
      .orElse(sys.env.get("PYSPARK_PYTHON"))
      .orElse(confs.get(ConfPrefix + "pythonExec"))
      .getOrElse("python3")

  private def durationMs(confs: Map[String, String], name: String, default: Long): Long =
    confs.get(ConfPrefix + name).map { raw =>
      try org.apache.spark.network.util.JavaUtils.timeStringAsMs(raw.trim)
      catch {
        case NonFatal(_) => throw new IllegalArgumentException(
          s"Invalid value '$raw' for conf '$ConfPrefix$name': expected a duration such as 500ms, 30s, 15m, 24h or 7d")
      }
    }.getOrElse(default)
}
