package io.keyedstate.bridge

import java.net.InetAddress
import java.util.concurrent.TimeUnit

import py4j.CallbackClient

/**
 * py4j's callback client (this JVM -> a state server) whose cleaner of idle connections runs on
 * one daemon thread for the whole JVM: py4j's own runs on a pool thread of each client that is not
 * a daemon, and kept a job's JVM from exiting after its work was done. Stopped with the client.
 */
private[bridge] final class DaemonCallbackClient(
    pythonPort: Int, pythonAddress: InetAddress, secret: String, idleTime: Long, idleUnit: TimeUnit,
    sockets: javax.net.SocketFactory, timeoutMs: Int)
  // An idle time of 0 for py4j: its own cleaner is never scheduled, so its pool starts no thread.
  extends CallbackClient(pythonPort, pythonAddress, secret, 0L, idleUnit, sockets, false, timeoutMs) {
  private val cleaner = DaemonCallbackClient.Cleaner.scheduleAtFixedRate(
    () => periodicCleanup(), idleTime, idleTime, idleUnit)

  override def shutdown(): Unit = {
    cleaner.cancel(false)
    super.shutdown()
  }

  override def copyWith(newAddress: InetAddress, newPort: Int): py4j.Py4JPythonClient =
    new DaemonCallbackClient(newPort, newAddress, secret, idleTime, idleUnit, sockets, timeoutMs)
}

private[bridge] object DaemonCallbackClient {
  // py4j logs every command it sends and every answer at INFO (java.util.logging, which Spark
  // routes into the executor's log) unless its GatewayServer class has been initialised, which
  // turns py4j's logging off; an executor JVM never loads that class otherwise.
  Class.forName("py4j.GatewayServer", true, classOf[CallbackClient].getClassLoader)

  private val Cleaner = java.util.concurrent.Executors.newSingleThreadScheduledExecutor((r: Runnable) => {
    val t = new Thread(r, "keyedstate-callback-cleaner")
    t.setDaemon(true)
    t
  })
}
