package io.keyedstate.engine

import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper

import io.keyedstate.bridge.{DataChannel, PythonStateServer, ServerLaunch, StateServerProcess}

/**
 * One store opened on a state server of this executor: the process, the store's handle there and
 * its settings. [[ensureOpen]] reopens the store on a new server after the old one died (the
 * engine then reloads everything). A failed exchange calls `onFailure` (the engine forgets the
 * version it holds) before the error reaches the task.
 */
final class ServerSession(launch: ServerLaunch, slot: Int, storeName: String, confsJson: String,
    describe: String, onFailure: () => Unit) {
  import ServerSession.Json

  @volatile private var server: StateServerProcess = _
  @volatile private var handle: Int = -1
  @volatile private var current: StoreSettings = _

  def settings: StoreSettings = current
  def process: StateServerProcess = server
  def isAlive: Boolean = server != null && server.isAlive

  /** Opens the store on the live server; true when it was (re)opened just now. */
  def ensureOpen(): Boolean = {
    val live = StateServerProcess.get(launch, slot)
    if (live eq server) false
    else {
      val json = Json.readTree(live.control(s"opening $describe")(_.openStore(storeName, confsJson)))
      server = live
      handle = json.get("handle").asInt()
      current = StoreSettings(json)
      true
    }
  }

  /** A control call (py4j) with this store's handle; failures invalidate the engine's version. */
  def control[T](what: String)(f: (PythonStateServer, Int) => T): T =
    try open(what).control(what)(f(_, handle)) catch { case NonFatal(e) => onFailure(); throw e }

  /** A control call from maintenance: a failure is retried at the next tick and leaves the
   *  version the tasks use alone. */
  def maintenance[T](what: String)(f: (PythonStateServer, Int) => T): T = open(what).control(what)(f(_, handle))

  /** A data-channel exchange with this store's handle; failures invalidate the engine's version. */
  def data[T](what: String)(f: (DataChannel, Int) => T): T =
    try open(what).withChannel(what)(f(_, handle)) catch { case NonFatal(e) => onFailure(); throw e }

  /** The server, or a clear error once the store was closed: Spark closes a provider (e.g. after
   *  a failed maintenance call, or a stopped run's) even while a task still uses its store. */
  private def open(what: String): StateServerProcess = {
    val s = server
    if (s == null) {
      throw new IllegalStateException(s"keyedstate: $what failed: $describe was closed (Spark unloaded its " +
        "provider) while a task still used it; the task fails and its retry reloads the version")
    }
    s
  }

  /** Closes the store on its server (if that is still alive); idempotent. */
  def close(): Unit = {
    val s = server
    server = null
    if (s != null && s.isAlive && handle >= 0) {
      try s.control("closing a store")(_.closeStore(handle))
      catch { case NonFatal(e) => ServerSession.log.warn(s"keyedstate: closing $describe failed", e) }
    }
  }
}

object ServerSession {
  private val Json = new ObjectMapper()
  private val log = org.slf4j.LoggerFactory.getLogger(classOf[ServerSession])
}
