package io.keyedstate.spark

import java.io.ByteArrayOutputStream
import java.nio.charset.StandardCharsets
import java.nio.file.Files
import java.util.concurrent.{ConcurrentHashMap, TimeUnit}

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.spark.SparkEnv
import org.apache.spark.keyedstate.SparkErrors
import org.apache.spark.sql.internal.SQLConf
import org.slf4j.LoggerFactory

import io.keyedstate.bridge.ServerLaunch

/**
 * The session's keyedstate confs, checked on the driver when a stateful query plans a batch
 * (Spark asks the provider class for its metrics there, before any task), so that a bad conf is
 * the query's exception and no task starts. The rule is conf.py's alone: it runs in one Python
 * process per distinct set of confs in this JVM (`keyedstate.conf.check_main`). A driver that
 * cannot run it (no Python with keyedstate, or one that does not answer in time) leaves the check
 * to the state servers, which apply the same rule when a task opens a store.
 *
 * The interpreter comes from the application's configuration alone ([[driverPython]]), never from
 * a session conf, which any SQL statement can SET: planning runs no program a query names. The
 * child never blocks planning beyond [[TimeoutMs]]: its input comes from a file, its output is
 * read on a thread, and on timeout it is killed with every process it started. An answer from
 * another keyedstate version than this jar's is not used.
 *
 * A refused value is Spark's `INVALID_CONF_VALUE.REQUIREMENT` (naming the conf and its value,
 * with conf.py's line as the requirement); any other refusal (an unknown key, with its "did you
 * mean") fits no class of Spark's and stays a plain IllegalArgumentException with conf.py's line.
 */
object DriverConfCheck {
  private val log = LoggerFactory.getLogger(getClass)
  private val Json = new ObjectMapper()
  private val TimeoutMs = 60000L
  private val MaxOutputBytes = 1 << 16
  /** The keyedstate this jar was built for (its manifest's Implementation-Version; None: unknown). */
  private lazy val JarVersion: Option[String] = Option(getClass.getPackage).flatMap(p => Option(p.getImplementationVersion))
  // Each distinct set of confs -> conf.py's refusal of it (None: accepted, or not checkable).
  private val checked = new ConcurrentHashMap[Map[String, String], Option[Refusal]]()

  /** conf.py's one-line message, and the conf and value it names when the value alone is bad. */
  final case class Refusal(message: String, conf: Option[String], value: Option[String]) {
    def exception: IllegalArgumentException = (conf, value) match {
      case (Some(c), Some(v)) => SparkErrors.invalidConfValue(c, v, message)
      case _ => new IllegalArgumentException(message)
    }
  }

  /** Throws IllegalArgumentException ([[Refusal.exception]]) with conf.py's message if the
   *  session's confs are bad; a no-op on executors. */
  def onDriver(): Unit = {
    val env = SparkEnv.get
    if (env == null || env.executorId != "driver") return // SparkContext.DRIVER_IDENTIFIER (private[spark])
    val confs = SQLConf.get.getAllConfs.filter(_._1.startsWith(ServerLaunch.ConfPrefix))
    if (confs.isEmpty) return
    // Not computeIfAbsent: its lock would hold every other plan of these confs while the child runs.
    val answer = Option(checked.get(confs)).getOrElse {
      val fresh = ask(confs.asJava, driverPython(env), TimeoutMs)
      Option(checked.putIfAbsent(confs, fresh)).getOrElse(fresh)
    }
    answer.foreach(refusal => throw refusal.exception)
  }

  /** The driver's Python: `spark.pyspark.python`, PYSPARK_PYTHON, then the application's
   *  `pythonExec` (what keyedstate.configure() sets), from SparkConf; else python3. */
  private[keyedstate] def driverPython(env: SparkEnv): String =
    env.conf.getOption("spark.pyspark.python")
      .orElse(sys.env.get("PYSPARK_PYTHON"))
      .orElse(env.conf.getOption(ServerLaunch.ConfPrefix + "pythonExec"))
      .getOrElse("python3")

  /** conf.py's refusal of `confs` from `python` (None: accepted, or no answer within `timeoutMs`);
   *  public for the tests, which give it a Python that never answers. */
  def ask(confs: java.util.Map[String, String], python: String, timeoutMs: Long): Option[Refusal] = {
    val input = try Files.createTempFile("keyedstate-confs", ".json") catch {
      case NonFatal(e) =>
        log.info(s"keyedstate: cannot check the keyedstate confs on the driver (${e.getMessage}); the state " +
          "servers check them when a task opens a store")
        return None
    }
    try {
      Files.write(input, Json.writeValueAsBytes(confs))
      val builder = new ProcessBuilder(python, "-c", "from keyedstate.conf import check_main; check_main()")
        .redirectErrorStream(true).redirectInput(input.toFile)
      builder.environment().put("PYTHONSAFEPATH", "1") // never import from the working directory
      val process = builder.start()
      val output = new ByteArrayOutputStream()
      val reader = new Thread(() => {
        val in = process.getInputStream
        val buf = new Array[Byte](8192)
        try {
          var n = in.read(buf)
          while (n >= 0) {
            output.synchronized { if (output.size() < MaxOutputBytes) output.write(buf, 0, n) }
            n = in.read(buf)
          }
        } catch { case NonFatal(_) => } // the stream closes when the child is killed
      }, "keyedstate-driver-conf-check")
      reader.setDaemon(true)
      reader.start()
      val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs)
      try {
        val exited = process.waitFor(timeoutMs, TimeUnit.MILLISECONDS)
        // a process the child left behind may hold its output open: wait no longer than the limit
        if (exited) reader.join(math.max(1L, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())))
        if (!exited || reader.isAlive) {
          log.info(s"keyedstate: '$python' did not check the keyedstate confs within $timeoutMs ms; " +
            "the state servers check them when a task opens a store")
          return None
        }
        val text = output.synchronized(new String(output.toByteArray, StandardCharsets.UTF_8))
        val answer = text.split("\n").map(_.trim).filter(_.startsWith("{\"error\"")).lastOption
        answer match {
          case Some(line) =>
            val node = Json.readTree(line)
            val version = Option(node.get("version")).filterNot(_.isNull).map(_.asText())
            // another keyedstate's rules may differ from the state servers' (which run this jar's)
            if (JarVersion.exists(v => !version.contains(v))) {
              log.info(s"keyedstate: '$python' runs ${version.fold("a keyedstate that names no version")(v => s"keyedstate $v")}, this jar is " +
                s"keyedstate ${JarVersion.get}: its conf check is not used; the state servers check the confs when a " +
                "task opens a store")
              None
            } else {
              def text(field: String) = Option(node.get(field)).filterNot(_.isNull).map(_.asText())
              text("error").map(Refusal(_, text("conf"), text("value")))
            }
          case None =>
            log.info(s"keyedstate: '$python' cannot check the keyedstate confs on the driver (exit " +
              s"${process.exitValue()}): ${text.trim.split("\n").lastOption.getOrElse("")}; the state " +
              "servers check them when a task opens a store")
            None
        }
      } finally {
        process.descendants().forEach(p => { p.destroyForcibly(); () })
        process.destroyForcibly()
      }
    } catch {
      case NonFatal(e) =>
        log.info(s"keyedstate: cannot run '$python' to check the keyedstate confs on the driver (${e.getMessage}); " +
          "the state servers check them when a task opens a store")
        None
    } finally {
      try Files.deleteIfExists(input) catch { case NonFatal(_) => }
    }
  }
}
