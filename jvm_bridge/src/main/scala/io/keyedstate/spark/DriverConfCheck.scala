package io.keyedstate.spark

import java.nio.charset.StandardCharsets
import java.util.concurrent.{ConcurrentHashMap, TimeUnit}

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.spark.SparkEnv
import org.apache.spark.sql.internal.SQLConf
import org.slf4j.LoggerFactory

import io.keyedstate.bridge.ServerLaunch

/**
 * The session's keyedstate confs, checked on the driver when a stateful query plans a batch
 * (Spark asks the provider class for its metrics there, before any task), so that a bad conf is
 * the query's exception and no task starts. The rule is conf.py's alone: it runs in one Python
 * process per distinct set of confs in this JVM (`keyedstate.conf.check_main`). A driver that
 * cannot run it (no Python with keyedstate) leaves the check to the state servers, which apply
 * the same rule when a task opens a store.
 */
object DriverConfCheck {
  private val log = LoggerFactory.getLogger(getClass)
  private val Json = new ObjectMapper()
  private val TimeoutMs = 60000L
  // Each distinct set of confs -> conf.py's message for it (None: accepted, or not checkable).
  private val checked = new ConcurrentHashMap[Map[String, String], Option[String]]()

  /** Throws IllegalArgumentException with conf.py's message if the session's confs are bad;
   *  a no-op on executors. */
  def onDriver(): Unit = {
    val env = SparkEnv.get
    if (env == null || env.executorId != "driver") return // SparkContext.DRIVER_IDENTIFIER (private[spark])
    val confs = SQLConf.get.getAllConfs.filter(_._1.startsWith(ServerLaunch.ConfPrefix))
    if (confs.isEmpty) return
    checked.computeIfAbsent(confs, c => ask(c)).foreach(message => throw new IllegalArgumentException(message))
  }

  private def ask(confs: Map[String, String]): Option[String] = {
    val python = ServerLaunch.python(confs)
    val builder = new ProcessBuilder(python, "-c", "from keyedstate.conf import check_main; check_main()")
      .redirectErrorStream(true)
    builder.environment().put("PYTHONSAFEPATH", "1") // never import from the working directory
    try {
      val process = builder.start()
      try {
        val stdin = process.getOutputStream
        stdin.write(Json.writeValueAsBytes(confs.asJava))
        stdin.close()
        if (!process.waitFor(TimeoutMs, TimeUnit.MILLISECONDS)) {
          log.info(s"keyedstate: '$python' did not check the keyedstate confs within $TimeoutMs ms; " +
            "the state servers check them when a task opens a store")
          return None
        }
        val output = new String(process.getInputStream.readAllBytes(), StandardCharsets.UTF_8)
        val answer = output.split("\n").map(_.trim).filter(_.startsWith("{\"error\"")).lastOption
        answer match {
          case Some(line) => Option(Json.readTree(line).get("error")).filterNot(_.isNull).map(_.asText())
          case None =>
            log.info(s"keyedstate: '$python' cannot check the keyedstate confs on the driver (exit " +
              s"${process.exitValue()}): ${output.trim.split("\n").lastOption.getOrElse("")}; the state " +
              "servers check them when a task opens a store")
            None
        }
      } finally process.destroyForcibly()
    } catch {
      case NonFatal(e) =>
        log.info(s"keyedstate: cannot run '$python' to check the keyedstate confs on the driver (${e.getMessage}); " +
          "the state servers check them when a task opens a store")
        None
    }
  }
}
