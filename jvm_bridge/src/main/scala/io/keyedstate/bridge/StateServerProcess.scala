package io.keyedstate.bridge

import java.io.{File, IOException, OutputStream}
import java.net.{InetAddress, InetSocketAddress, ServerSocket, Socket}
import java.nio.charset.StandardCharsets
import java.nio.file.{Files, Path, Paths}
import java.nio.file.attribute.PosixFilePermissions
import java.security.SecureRandom
import java.util.concurrent.{ConcurrentLinkedDeque, CountDownLatch, TimeUnit}
import javax.net.{ServerSocketFactory, SocketFactory}

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
 * One Python state server process with its py4j gateway (loopback only, random secret,
 * TCP_NODELAY on every socket) and its pool of bulk [[DataChannel]]s.
 */
final class StateServerProcess private (
    val generation: Int,
    val workDir: Path,
    process: Process,
    stdin: OutputStream,
    gateway: GatewayServer,
    val api: PythonStateServer,
    dataPath: Path,
    val pid: Int) {

  private val channels = new ConcurrentLinkedDeque[DataChannel]()
  def logFile: Path = workDir.resolve("server.log")
  def isAlive: Boolean = process.isAlive

  /** Runs `f` with a pooled data channel; a broken channel is closed, not returned. */
  def withChannel[T](what: String)(f: DataChannel => T): T = {
    val channel = Option(channels.poll()).getOrElse(openChannel(what))
    try {
      val result = f(channel)
      channels.push(channel)
      result
    } catch {
      case e: StateServerException => channels.push(channel); throw e
      case NonFatal(e) => channel.close(); throw translate(what, e)
    }
  }

  private def openChannel(what: String): DataChannel =
    try new DataChannel(dataPath) catch { case NonFatal(e) => throw translate(what, e) }

  /** Runs a control call; a dead server or a Python exception becomes a clear error. */
  def control[T](what: String)(f: PythonStateServer => T): T =
    try f(api) catch { case NonFatal(e) => throw translate(what, e) }

  private def translate(what: String, e: Throwable): RuntimeException = e match {
    case d: StateServerDiedException => d
    case s: StateServerException => s
    case _ if !process.waitFor(200, TimeUnit.MILLISECONDS) && process.isAlive =>
      new StateServerException(s"keyedstate: $what failed: ${StateServerProcess.pythonMessage(e)}", e)
    case _ =>
      new StateServerDiedException(
        s"keyedstate state server (pid $pid) died during $what (exit code ${process.exitValue()}). " +
          s"The task fails; its retry starts a new server and reloads the state from the " +
          s"checkpoint. Server log: $logFile${StateServerProcess.tail(logFile)}", e)
  }

  def destroy(): Unit = {
    channels.forEach(c => c.close())
    channels.clear()
    try stdin.close() catch { case NonFatal(_) => }
    process.destroy()
    if (!process.waitFor(5, TimeUnit.SECONDS)) process.destroyForcibly()
    try gateway.shutdown() catch { case NonFatal(_) => }
  }
}

object StateServerProcess {
  private val log = LoggerFactory.getLogger(classOf[StateServerProcess])
  private val loopback = InetAddress.getLoopbackAddress

  // A small pool: Python's GIL serialises one process, so partitions are spread over several.
  @volatile private var servers: Array[StateServerProcess] = _
  private var generations = 0
  private var baseDir: Path = _

  /** The number of server processes of this JVM (fixed by the first store opened). */
  def poolSize(launch: ServerLaunch): Int = synchronized {
    if (servers == null) servers = new Array[StateServerProcess](math.max(1, launch.processes))
    servers.length
  }

  /** The live server of pool slot `slot`, started (or restarted after a death) on demand. */
  def get(launch: ServerLaunch, slot: Int): StateServerProcess = {
    val index = Math.floorMod(slot, poolSize(launch))
    val server = servers(index)
    if (server != null && server.isAlive) server else synchronized {
      val current = servers(index)
      if (current == null || !current.isAlive) {
        if (current != null) {
          log.warn(s"keyedstate state server (pid ${current.pid}) is dead; starting a new one")
          current.destroy()
        }
        generations += 1
        servers(index) = start(generations, launch)
      }
      servers(index)
    }
  }

  private def start(generation: Int, launch: ServerLaunch): StateServerProcess = {
    if (baseDir == null) {
      baseDir = launch.localDir match {
        case Some(dir) => Files.createDirectories(Paths.get(dir))
        case None =>
          val dir = Files.createTempDirectory("keyedstate-",
            PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")))
          sys.addShutdownHook(deleteRecursively(dir.toFile))
          dir
      }
      sys.addShutdownHook(Option(servers).foreach(_.foreach(s => if (s != null) s.destroy())))
    }
    val workDir = Files.createDirectories(baseDir.resolve(s"server-$generation-${ProcessHandle.current().pid()}"))
    val secret = randomSecret()
    val entry = new GatewayEntry
    val gateway = new GatewayServer.GatewayServerBuilder()
      .entryPoint(entry)
      .javaPort(0)
      .javaAddress(loopback)
      .authToken(secret)
      .serverSocketFactory(NoDelayServerSocketFactory)
      .callbackClient(new CallbackClient(0, loopback, secret, 30L, TimeUnit.SECONDS,
        NoDelaySocketFactory, false, launch.callTimeoutMs))
      .build()
    gateway.start(true)
    val logFile = workDir.resolve("server.log").toFile
    val builder = new ProcessBuilder(launch.pythonExec, "-m", "keyedstate.server")
      .redirectErrorStream(true)
      .redirectOutput(ProcessBuilder.Redirect.appendTo(logFile))
    val env = builder.environment()
    env.put("KEYEDSTATE_GATEWAY_PORT", gateway.getListeningPort.toString)
    env.put("KEYEDSTATE_GATEWAY_SECRET", secret)
    env.put("KEYEDSTATE_WORK_DIR", workDir.toString)
    env.put("PYTHONUNBUFFERED", "1")
    val process = try builder.start() catch {
      case e: IOException =>
        gateway.shutdown()
        throw new StateServerException(
          s"keyedstate: cannot start the state server with Python '${launch.pythonExec}' " +
            "(set spark.sql.streaming.stateStore.keyedstate.pythonExec, spark.pyspark.python " +
            s"or PYSPARK_PYTHON to a Python with keyedstate installed): ${e.getMessage}", e)
    }
    val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(launch.startupTimeoutMs)
    while (!entry.ready.await(100, TimeUnit.MILLISECONDS)) {
      if (!process.isAlive || System.nanoTime() > deadline) {
        process.destroyForcibly()
        gateway.shutdown()
        val why = if (process.isAlive) s"did not connect within ${launch.startupTimeoutMs} ms"
          else s"exited with code ${process.exitValue()}"
        throw new StateServerException(
          s"keyedstate: the state server ('${launch.pythonExec} -m keyedstate.server') $why. " +
            s"Log: ${logFile}${tail(logFile.toPath)}")
      }
    }
    val api = gateway.getPythonServerEntryPoint(Array(classOf[PythonStateServer]))
      .asInstanceOf[PythonStateServer]
    val dataPath = Paths.get(api.dataSocketPath())
    log.info(s"keyedstate state server $generation started (pid ${entry.pid}, work dir $workDir)")
    new StateServerProcess(generation, workDir, process, process.getOutputStream, gateway, api,
      dataPath, entry.pid)
  }

  private def randomSecret(): String = {
    val bytes = new Array[Byte](32)
    new SecureRandom().nextBytes(bytes)
    bytes.map(b => f"${b & 0xff}%02x").mkString
  }

  /** The last line of a Python traceback carried by a py4j exception, else the message. */
  private[keyedstate] def pythonMessage(e: Throwable): String = {
    val msg = Option(e.getMessage).getOrElse(e.getClass.getName)
    val lines = msg.split("\n").map(_.trim).filter(_.nonEmpty)
    if (msg.contains("Traceback")) lines.last else msg
  }

  private[keyedstate] def tail(path: Path, lines: Int = 20): String =
    try {
      val all = new String(Files.readAllBytes(path), StandardCharsets.UTF_8).split("\n")
      "\n--- last lines of the server log ---\n" + all.takeRight(lines).mkString("\n")
    } catch { case NonFatal(_) => "" }

  private def deleteRecursively(f: File): Unit = {
    Option(f.listFiles()).foreach(_.foreach(deleteRecursively))
    f.delete()
  }
}

/** Server sockets whose accepted connections have TCP_NODELAY (py4j's default waits on Nagle). */
object NoDelayServerSocketFactory extends ServerSocketFactory {
  private final class NoDelayServerSocket extends ServerSocket {
    override def accept(): Socket = { val s = super.accept(); s.setTcpNoDelay(true); s }
  }
  override def createServerSocket(): ServerSocket = new NoDelayServerSocket
  override def createServerSocket(port: Int): ServerSocket = bound(port, 50, null)
  override def createServerSocket(port: Int, backlog: Int): ServerSocket = bound(port, backlog, null)
  override def createServerSocket(port: Int, backlog: Int, addr: InetAddress): ServerSocket =
    bound(port, backlog, addr)
  private def bound(port: Int, backlog: Int, addr: InetAddress): ServerSocket = {
    val s = new NoDelayServerSocket
    s.bind(new InetSocketAddress(Option(addr).getOrElse(InetAddress.getLoopbackAddress), port), backlog)
    s
  }
}

/** Client sockets with TCP_NODELAY, for py4j's callback connections to Python. */
object NoDelaySocketFactory extends SocketFactory {
  private def nodelay(s: Socket): Socket = { s.setTcpNoDelay(true); s }
  override def createSocket(): Socket = nodelay(new Socket())
  override def createSocket(host: String, port: Int): Socket = nodelay(new Socket(host, port))
  override def createSocket(host: String, port: Int, local: InetAddress, localPort: Int): Socket =
    nodelay(new Socket(host, port, local, localPort))
  override def createSocket(host: InetAddress, port: Int): Socket = nodelay(new Socket(host, port))
  override def createSocket(host: InetAddress, port: Int, local: InetAddress, localPort: Int): Socket =
    nodelay(new Socket(host, port, local, localPort))
}
