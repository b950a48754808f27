package io.keyedstate.bridge

import java.io.{IOException, OutputStream}
import java.net.{InetAddress, SocketTimeoutException}
import java.nio.charset.StandardCharsets
import java.nio.file.{Files, LinkOption, Path, Paths}
import java.util.concurrent.{ConcurrentLinkedDeque, CountDownLatch, TimeUnit}

import scala.util.control.NonFatal

import org.slf4j.LoggerFactory
import py4j.{CallbackClient, GatewayServer}

/** The state server process died; the task fails and its retry starts a new server. */
class StateServerDiedException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)

/** The state server refused a request (bad conf, corrupt checkpoint file, ...). */
class StateServerException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)

/** How to start a state server: the JVM-side knobs, read before Python exists. */
final case class ServerLaunch(
    pythonExec: String,
    localDir: Option[String],
    startupTimeoutMs: Long,
    callTimeoutMs: Int,
    processes: Int)

object ServerLaunch {
  val ConfPrefix = "spark.sql.streaming.stateStore.keyedstate."

  /**
   * The launch knobs from the query's keyedstate confs (Python validates every conf again when
   * a store opens). Durations use Spark's own time-string parser, the rule conf.py implements.
   */
  def fromConfs(confs: Map[String, String]): ServerLaunch = {
    val sparkConf = Option(org.apache.spark.SparkEnv.get).map(_.conf)
    // Same Python as the query's PySpark workers first; then our own knob (which
    // keyedstate.configure() sets to the driver's interpreter); then python3.
    val python = sparkConf.flatMap(_.getOption("spark.pyspark.python"))
      .orElse(sys.env.get("PYSPARK_PYTHON"))
      .orElse(confs.get(ConfPrefix + "pythonExec"))
      .getOrElse("python3")
    val processes = confs.get(ConfPrefix + "serverProcesses").flatMap(_.trim.toIntOption).filter(_ > 0)
      .orElse(sparkConf.flatMap(_.getOption("spark.executor.cores")).flatMap(_.toIntOption))
      .getOrElse(Runtime.getRuntime.availableProcessors())
    ServerLaunch(python, confs.get(ConfPrefix + "localDir"),
      durationMs(confs, "serverStartupTimeout", 60000L),
      math.min(Int.MaxValue.toLong, durationMs(confs, "bridgeTimeout", 600000L)).toInt,
      processes)
  }

  private def durationMs(confs: Map[String, String], name: String, default: Long): Long =
    confs.get(ConfPrefix + name).map { raw =>
      try org.apache.spark.network.util.JavaUtils.timeStringAsMs(raw.trim)
      catch {
        case NonFatal(_) => throw new IllegalArgumentException(
          s"Invalid value '$raw' for conf '$ConfPrefix$name': expected a duration such as 500ms, 30s, 15m, 24h or 7d")
      }
    }.getOrElse(default)
}

/** A gateway entry point through which the Python side announces that it is ready. */
final class GatewayEntry {
  private[bridge] val ready = new CountDownLatch(1)
  @volatile private[bridge] var pid: Int = -1
  def serverReady(pid: Int): Unit = { this.pid = pid; ready.countDown() }
}

/**
 * One Python state server process with its py4j gateway (loopback only, TCP_NODELAY on every
 * socket) and its pool of bulk [[DataChannel]]s. Three random secrets, one per direction and
 * channel: the server's calls into this JVM's gateway, this JVM's callbacks into the server, and
 * the data channel's HELLO. Its files live in `workDir`, private to the user, and go with it.
 */
final class StateServerProcess private (
    val generation: Int,
    val workDir: Path,
    process: Process,
    stdin: OutputStream,
    gateway: GatewayServer,
    val api: PythonStateServer,
    dataPath: Path,
    dataSecret: Array[Byte],
    timeoutMs: Int,
    output: ServerLog,
    val pid: Int) {

  private val channels = new ConcurrentLinkedDeque[DataChannel]()
  @volatile private var hung = false
  def logFile: Path = output.path
  def isAlive: Boolean = !hung && process.isAlive

  /** Runs `f` with a pooled data channel; a broken channel is closed, not returned. */
  def withChannel[T](what: String)(f: DataChannel => T): T = {
    val channel = pooledChannel(what)
    try {
      val result = f(channel)
      channels.push(channel)
      result
    } catch {
      case e: StateServerException => channels.push(channel); throw e
      case NonFatal(e) => channel.close(); throw translate(what, e)
    }
  }

  private def pooledChannel(what: String): DataChannel = {
    var channel = channels.poll()
    while (channel != null && !channel.isOpen) channel = channels.poll() // cut off by a timeout
    if (channel != null) channel
    else try new DataChannel(dataPath, dataSecret, timeoutMs) catch { case NonFatal(e) => throw translate(what, e) }
  }

  /** Runs a control call; a dead server or a Python exception becomes a clear error. */
  def control[T](what: String)(f: PythonStateServer => T): T =
    try f(api) catch { case NonFatal(e) => throw translate(what, e) }

  private def translate(what: String, e: Throwable): RuntimeException = e match {
    case d: StateServerDiedException => d
    case s: StateServerException => s
    case _ if StateServerProcess.timedOut(e) && process.isAlive =>
      // Hung (or far too slow): stop it, so that the task's retry gets a new server.
      hung = true
      process.destroyForcibly()
      new StateServerDiedException(
        s"keyedstate state server (pid $pid) did not answer $what within the bridge timeout " +
          s"(${ServerLaunch.ConfPrefix}bridgeTimeout = $timeoutMs ms): it is considered hung and is stopped. " +
          s"The task fails; its retry starts a new server and reloads the state from the checkpoint. " +
          s"Server log: $logFile${output.tail()}", e)
    case _ if !hung && !exited(200) =>
      new StateServerException(s"keyedstate: $what failed: ${StateServerProcess.pythonMessage(e)}", e)
    case _ =>
      // Hung: another exchange (a concurrent task's) timed out first and stopped it.
      val code = if (hung) s"stopped as hung: an exchange got no answer within the bridge timeout, " +
          s"${ServerLaunch.ConfPrefix}bridgeTimeout = $timeoutMs ms"
        else s"exit code ${process.exitValue()}"
      new StateServerDiedException(
        s"keyedstate state server (pid $pid) died during $what ($code). " +
          s"The task fails; its retry starts a new server and reloads the state from the " +
          s"checkpoint. Server log: $logFile${output.tail()}", e)
  }

  /** Whether the process has exited, waiting up to `ms` for it; an interrupt (a killed task)
   *  ends the wait and is kept for the caller. */
  private def exited(ms: Long): Boolean =
    try process.waitFor(ms, TimeUnit.MILLISECONDS) || !process.isAlive
    catch { case _: InterruptedException => Thread.currentThread().interrupt(); !process.isAlive }

  def destroy(): Unit = {
    channels.forEach(c => c.close())
    channels.clear()
    try stdin.close() catch { case NonFatal(_) => }
    process.destroy()
    if (!process.waitFor(5, TimeUnit.SECONDS)) {
      process.destroyForcibly()
      process.waitFor(5, TimeUnit.SECONDS)
    }
    try gateway.shutdown() catch { case NonFatal(_) => }
    output.awaitEnd(2000)
    // A data socket the server had to put outside its work dir (a path too long for AF_UNIX).
    if (!dataPath.startsWith(workDir)) {
      try LocalRoot.removeSocketDir(workDir, Files.getOwner(workDir, LinkOption.NOFOLLOW_LINKS))
      catch { case NonFatal(_) => }
    }
  }

  /** Deletes what the (destroyed) server kept locally: its stores, its data socket, the JVM's
   *  downloads and native readers for it. Its log stays unless `withLog`. */
  private[bridge] def removeFiles(withLog: Boolean): Unit =
    if (withLog) LocalFiles.deleteTree(workDir)
    else try {
      val stream = Files.list(workDir)
      try stream.forEach { p =>
        if (!p.getFileName.toString.startsWith(ServerLog.Name)) LocalFiles.deleteTree(p)
      } finally stream.close()
    } catch { case NonFatal(_) => }
}

object StateServerProcess {
  private val log = LoggerFactory.getLogger(classOf[StateServerProcess])
  private val loopback = InetAddress.getLoopbackAddress
  /** Logs of replaced (dead) servers kept for diagnosis; older ones are deleted. */
  private val KeptDeadLogs = 4

  // A small pool: Python's GIL serialises one process, so partitions are spread over several.
  @volatile private var servers: Array[StateServerProcess] = _
  private var generations = 0
  private var root: LocalRoot = _
  private val retired = new java.util.ArrayDeque[StateServerProcess]()
  private val beforeExit = new java.util.concurrent.CopyOnWriteArrayList[Runnable]()

  /** Work to finish at the JVM's exit while the servers and their files are still there (it
   *  bounds its own wait); runs before the servers are stopped. */
  def runBeforeServersStop(work: Runnable): Unit = beforeExit.addIfAbsent(work)

  /** The number of server processes of this JVM (fixed by the first store opened). */
  def poolSize(launch: ServerLaunch): Int = synchronized {
    if (servers == null) servers = new Array[StateServerProcess](math.max(1, launch.processes))
    servers.length
  }

  /** RocksDB memory of every live server of this JVM (0 for one that does not answer). */
  def processMemoryBytes(): Long = Option(servers).toSeq.flatten.filter(s => s != null && s.isAlive).map { s =>
    try s.control("reading server memory")(_.processMemoryBytes()).toLong catch { case NonFatal(_) => 0L }
  }.sum

  /** The live server of pool slot `slot`, started (or restarted after a death) on demand. */
  def get(launch: ServerLaunch, slot: Int): StateServerProcess = {
    val index = Math.floorMod(slot, poolSize(launch))
    val server = servers(index)
    if (server != null && server.isAlive) server else synchronized {
      val current = servers(index)
      if (current == null || !current.isAlive) {
        if (current != null) {
          log.warn(s"keyedstate state server (pid ${current.pid}) is dead; starting a new one")
          servers(index) = null
          retire(current)
        }
        generations += 1
        servers(index) = start(generations, launch)
      }
      servers(index)
    }
  }

  /** A dead server's files go when it is replaced; its log stays for a while (the task's error
   *  names it), for the last [[KeptDeadLogs]] dead servers. */
  private def retire(dead: StateServerProcess): Unit = {
    dead.destroy()
    dead.removeFiles(withLog = false)
    retired.addLast(dead)
    while (retired.size > KeptDeadLogs) retired.removeFirst().removeFiles(withLog = true)
  }

  /** This JVM's private directory, made at the first start; what JVMs that are gone left next to
   *  it is removed then. Removed with every server at the JVM's exit. */
  private def localRoot(launch: ServerLaunch): LocalRoot = {
    if (root == null) {
      val parent = launch.localDir.map(d => Paths.get(d)).getOrElse(Paths.get(System.getProperty("java.io.tmpdir")))
      root = LocalRoot.create(parent)
      val created = root
      sys.addShutdownHook {
        beforeExit.forEach(w => try w.run() catch { case NonFatal(_) => })
        Option(servers).foreach(_.foreach(s => if (s != null) try s.destroy() catch { case NonFatal(_) => }))
        created.close()
      }
    }
    root
  }

  private def start(generation: Int, launch: ServerLaunch): StateServerProcess = {
    val workDir = LocalFiles.createNewPrivateDirectory(localRoot(launch).dir.resolve(s"server-$generation"))
    Seq("restore", "native").foreach(d => LocalFiles.createNewPrivateDirectory(workDir.resolve(d)))
    val gatewaySecret = LocalFiles.randomHex(32)
    val callbackSecret = LocalFiles.randomHex(32)
    val dataSecret = LocalFiles.randomHex(32)
    val entry = new GatewayEntry
    val gateway = new GatewayServer.GatewayServerBuilder()
      .entryPoint(entry)
      .javaPort(0)
      .javaAddress(loopback)
      .authToken(gatewaySecret)
      .serverSocketFactory(GuardedServerSocketFactory)
      .callbackClient(new CallbackClient(0, loopback, callbackSecret, 30L, TimeUnit.SECONDS,
        NoDelaySocketFactory, false, launch.callTimeoutMs))
      .build()
    gateway.start(true)
    val output = new ServerLog(workDir.resolve(ServerLog.Name))
    // In its private work dir, and not importing from its working directory (Python's -P):
    // a module planted where the job was launched never runs with the server's secrets.
    val builder = new ProcessBuilder(launch.pythonExec, "-m", "keyedstate.server").redirectErrorStream(true)
      .directory(workDir.toFile)
    val env = builder.environment()
    env.put("PYTHONSAFEPATH", "1")
    // PYTHONPATH's relative entries meant the JVM's working directory: they still do. An empty
    // entry (a stray ':') means the working directory, the server's own here: dropped.
    Option(env.get("PYTHONPATH")).foreach { path =>
      env.put("PYTHONPATH", path.split(java.io.File.pathSeparator, -1).filter(_.nonEmpty)
        .map(entry => Paths.get(entry).toAbsolutePath.toString).mkString(java.io.File.pathSeparator))
    }
    env.put("KEYEDSTATE_GATEWAY_PORT", gateway.getListeningPort.toString)
    env.put("KEYEDSTATE_GATEWAY_SECRET", gatewaySecret)
    env.put("KEYEDSTATE_CALLBACK_SECRET", callbackSecret)
    env.put("KEYEDSTATE_DATA_SECRET", dataSecret)
    env.put("KEYEDSTATE_WORK_DIR", workDir.toString)
    env.put("PYTHONUNBUFFERED", "1")
    env.put("KEYEDSTATE_SERVER_PROCESSES", poolSize(launch).toString) // its share of memoryBudget
    val process = try builder.start() catch {
      case e: IOException =>
        gateway.shutdown()
        output.close()
        throw new StateServerException(
          s"keyedstate: cannot start the state server with Python '${launch.pythonExec}' " +
            "(set spark.sql.streaming.stateStore.keyedstate.pythonExec, spark.pyspark.python " +
            s"or PYSPARK_PYTHON to a Python with keyedstate installed): ${e.getMessage}", e)
    }
    output.pump(process.getInputStream, s"keyedstate-server-$generation-output")
    val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(launch.startupTimeoutMs)
    while (!entry.ready.await(100, TimeUnit.MILLISECONDS)) {
      if (!process.isAlive || System.nanoTime() > deadline) {
        process.destroyForcibly()
        process.waitFor(5, TimeUnit.SECONDS)
        gateway.shutdown()
        output.awaitEnd(2000)
        val why = if (process.isAlive) s"did not connect within ${launch.startupTimeoutMs} ms"
          else s"exited with code ${process.exitValue()}"
        throw new StateServerException(
          s"keyedstate: the state server ('${launch.pythonExec} -m keyedstate.server') $why. " +
            s"Log: ${output.path}${output.tail()}")
      }
    }
    val api = gateway.getPythonServerEntryPoint(Array(classOf[PythonStateServer]))
      .asInstanceOf[PythonStateServer]
    val dataPath = Paths.get(api.dataSocketPath())
    log.info(s"keyedstate state server $generation started (pid ${entry.pid}, work dir $workDir)")
    new StateServerProcess(generation, workDir, process, process.getOutputStream, gateway, api,
      dataPath, dataSecret.getBytes(StandardCharsets.US_ASCII), launch.callTimeoutMs, output, entry.pid)
  }

  /** Whether a failure is a read timeout (py4j's control call, or the data channel's watchdog). */
  private[bridge] def timedOut(e: Throwable): Boolean =
    Iterator.iterate(e)(_.getCause).takeWhile(_ != null).take(10).exists {
      case _: SocketTimeoutException | _: DataChannelTimeoutException => true
      case _ => false
    }

  /** The last line of a Python traceback carried by a py4j exception, else the message. */
  private[keyedstate] def pythonMessage(e: Throwable): String = {
    val msg = Option(e.getMessage).getOrElse(e.getClass.getName)
    val lines = msg.split("\n").map(_.trim).filter(_.nonEmpty)
    if (msg.contains("Traceback")) lines.last else msg
  }
}
