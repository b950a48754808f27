package io.keyedstate.bridge

import java.io.{IOException, OutputStream}
import java.net.{InetAddress, SocketTimeoutException}
import java.nio.charset.StandardCharsets
import java.nio.file.{Files, LinkOption, Path, Paths}
import java.util.concurrent.{ConcurrentLinkedDeque, TimeUnit}

import scala.util.control.NonFatal

import org.slf4j.LoggerFactory
import py4j.Gateway

/**
 * One Python state server process, called through py4j over its callback server's Unix socket,
 * and its pool of bulk [[DataChannel]]s over another. Both sockets live in directories private to
 * the user, and this JVM opens no listener for the server: no other local user can connect to
 * either side. Two random secrets, one per channel: this JVM's control calls into the server, and
 * the data channel's HELLO. Its files live in `workDir`, private to the user, and go with it.
 */
final class StateServerProcess private (
    val generation: Int,
    val workDir: Path,
    process: Process,
    stdin: OutputStream,
    gateway: Gateway,
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
  /** The file in a server's work dir that says it is ready: its pid, then its callback socket's
   *  path (server/api.py READY_FILE). */
  private val ReadyFile = "ready"
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
    val callbackSecret = LocalFiles.randomHex(32)
    val dataSecret = LocalFiles.randomHex(32)
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
    env.put("KEYEDSTATE_CALLBACK_SECRET", callbackSecret)
    env.put("KEYEDSTATE_DATA_SECRET", dataSecret)
    env.put("KEYEDSTATE_WORK_DIR", workDir.toString)
    env.put("PYTHONUNBUFFERED", "1")
    env.put("KEYEDSTATE_SERVER_PROCESSES", poolSize(launch).toString) // its share of memoryBudget
    val process = try builder.start() catch {
      case e: IOException =>
        output.close()
        throw new StateServerException(
          s"keyedstate: cannot start the state server with Python '${launch.pythonExec}' " +
            "(set spark.sql.streaming.stateStore.keyedstate.pythonExec, spark.pyspark.python " +
            s"or PYSPARK_PYTHON to a Python with keyedstate installed): ${e.getMessage}", e)
    }
    output.pump(process.getInputStream, s"keyedstate-server-$generation-output")
    // A start that does not return its server (any failure, or the task's thread interrupted
    // while it waits) stops the process and its callback client: nothing else would.
    var gateway: Gateway = null
    try {
      val ready = workDir.resolve(ReadyFile)
      val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(launch.startupTimeoutMs)
      while (!Files.isRegularFile(ready, LinkOption.NOFOLLOW_LINKS)) {
        if (!process.isAlive || System.nanoTime() > deadline) {
          process.destroyForcibly()
          process.waitFor(5, TimeUnit.SECONDS)
          output.awaitEnd(2000)
          val why = if (process.isAlive) s"was not ready within ${launch.startupTimeoutMs} ms"
            else s"exited with code ${process.exitValue()}"
          throw new StateServerException(
            s"keyedstate: the state server ('${launch.pythonExec} -m keyedstate.server') $why. " +
              s"Log: ${output.path}${output.tail()}")
        }
        Thread.sleep(50)
      }
      val (pid, callbackPath) = new String(Files.readAllBytes(ready), StandardCharsets.UTF_8).split("\n") match {
        case Array(pid, path, _*) if pid.trim.toIntOption.isDefined && path.nonEmpty => (pid.trim.toInt, path)
        case _ => throw new StateServerException(s"keyedstate: the state server's ready file $ready is malformed")
      }
      val client = new DaemonCallbackClient(0, loopback, callbackSecret, launch.idleTimeoutMs, TimeUnit.MILLISECONDS,
        new UnixSocketFactory(Paths.get(callbackPath)), launch.callTimeoutMs)
      gateway = new Gateway(null, client)
      gateway.startup()
      val api = client.getPythonServerEntryPoint(gateway, Array(classOf[PythonStateServer]))
        .asInstanceOf[PythonStateServer]
      val dataPath = try Paths.get(api.dataSocketPath()) catch {
        case NonFatal(e) =>
          throw new StateServerException(s"keyedstate: the state server (pid $pid) does not answer on its " +
            s"callback socket $callbackPath: ${pythonMessage(e)}. Log: ${output.path}${output.tail()}", e)
      }
      log.info(s"keyedstate state server $generation started (pid $pid, work dir $workDir)")
      new StateServerProcess(generation, workDir, process, process.getOutputStream, gateway, api,
        dataPath, dataSecret.getBytes(StandardCharsets.US_ASCII), launch.callTimeoutMs, output, pid)
    } catch {
      case e: Throwable =>
        process.destroyForcibly()
        if (gateway != null) try gateway.shutdown() catch { case NonFatal(_) => }
        throw e
    }
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
