package io.keyedstate.bridge

import java.io.{IOException, InputStream, OutputStream}
import java.net.{InetAddress, InetSocketAddress, ServerSocket, Socket, SocketException}
import javax.net.{ServerSocketFactory, SocketFactory}

/**
 * Server sockets for the py4j gateway: accepted connections have TCP_NODELAY (py4j's default
 * waits on Nagle) and, until they have authenticated, may send at most [[PreAuthBytes]] and must
 * do so within [[PreAuthTimeoutMs]] in all (py4j reads the auth line unbounded and waits for
 * ever); at most [[PreAuthConnections]] may be unauthenticated at once (py4j gives each a
 * thread), the rest are closed at once. A failing accept (no file descriptor left) is retried:
 * py4j's accept loop ends on the first exception, and the gateway would never accept again.
 */
object GuardedServerSocketFactory extends ServerSocketFactory {
  val PreAuthBytes = 16 << 10
  val PreAuthTimeoutMs = 10000
  val PreAuthConnections = 32

  private final class GuardedServerSocket extends ServerSocket {
    private val unauthenticated = new java.util.concurrent.atomic.AtomicInteger

    override def accept(): Socket = {
      while (true) {
        if (isClosed) throw new SocketException("Socket is closed")
        val s = new PreAuthSocket(unauthenticated)
        try implAccept(s) catch {
          case e: IOException if !isClosed =>
            org.slf4j.LoggerFactory.getLogger(getClass).warn(s"keyedstate: py4j gateway accept failed (${e.getMessage}); retrying")
            Thread.sleep(100)
        }
        if (s.isConnected) {
          if (unauthenticated.incrementAndGet() > PreAuthConnections) s.close()
          else try {
            s.setTcpNoDelay(true)
            s.arm()
            return s
          } catch { case _: IOException => s.close() } // the peer is gone already
        }
      }
      throw new IllegalStateException("unreachable")
    }
  }
  override def createServerSocket(): ServerSocket = new GuardedServerSocket
  override def createServerSocket(port: Int): ServerSocket = bound(port, 50, null)
  override def createServerSocket(port: Int, backlog: Int): ServerSocket = bound(port, backlog, null)
  override def createServerSocket(port: Int, backlog: Int, addr: InetAddress): ServerSocket =
    bound(port, backlog, addr)
  private def bound(port: Int, backlog: Int, addr: InetAddress): ServerSocket = {
    val s = new GuardedServerSocket
    s.bind(new InetSocketAddress(Option(addr).getOrElse(InetAddress.getLoopbackAddress), port), backlog)
    s
  }

  /**
   * A connection that counts as authenticated once the gateway has written to it (py4j's first
   * write is its answer to the auth command; on a wrong token it closes the connection after
   * it). Until then its reads are capped and time out.
   */
  private final class PreAuthSocket(unauthenticated: java.util.concurrent.atomic.AtomicInteger) extends Socket {
    @volatile private var authenticated = false
    private var counted = true
    private var wantedTimeout = 0
    private var deadline = 0L
    private var in: InputStream = _
    private var out: OutputStream = _

    def arm(): Unit = { deadline = System.nanoTime() + PreAuthTimeoutMs * 1000000L; super.setSoTimeout(PreAuthTimeoutMs) }

    /** No longer among the unauthenticated connections (authenticated, or closed). */
    private def uncount(): Unit = synchronized { if (counted) { counted = false; unauthenticated.decrementAndGet() } }

    override def close(): Unit = { uncount(); super.close() }

    /** Before an unauthenticated read: the time left of the whole handshake, or none. */
    private def remaining(): Unit = synchronized {
      if (!authenticated) {
        val left = (deadline - System.nanoTime()) / 1000000L
        if (left <= 0) throw new java.net.SocketTimeoutException(s"keyedstate: an unauthenticated peer did not authenticate within $PreAuthTimeoutMs ms")
        super.setSoTimeout(left.toInt)
      }
    }

    override def setSoTimeout(timeout: Int): Unit = synchronized {
      wantedTimeout = timeout
      if (authenticated) super.setSoTimeout(timeout)
    }

    private def authenticate(): Unit = synchronized {
      if (!authenticated) {
        authenticated = true
        uncount()
        super.setSoTimeout(wantedTimeout)
      }
    }

    override def getInputStream: InputStream = synchronized {
      if (in == null) {
        val raw = super.getInputStream
        in = new InputStream {
          private var read0 = 0L
          private def room(len: Int): Int = {
            if (authenticated) len
            else {
              if (read0 >= PreAuthBytes) throw new IOException(
                s"keyedstate: an unauthenticated peer sent more than $PreAuthBytes bytes")
              remaining()
              math.min(len.toLong, PreAuthBytes - read0).toInt
            }
          }
          override def read(): Int = { room(1); val b = raw.read(); if (b >= 0) read0 += 1; b }
          override def read(b: Array[Byte], off: Int, len: Int): Int = {
            if (len == 0) return 0
            val n = raw.read(b, off, room(len))
            if (n > 0) read0 += n
            n
          }
          override def available(): Int = raw.available()
          override def close(): Unit = raw.close()
        }
      }
      in
    }

    override def getOutputStream: OutputStream = synchronized {
      if (out == null) {
        val raw = super.getOutputStream
        out = new OutputStream {
          override def write(b: Int): Unit = { authenticate(); raw.write(b) }
          override def write(b: Array[Byte], off: Int, len: Int): Unit = { authenticate(); raw.write(b, off, len) }
          override def flush(): Unit = raw.flush()
          override def close(): Unit = raw.close()
        }
      }
      out
    }
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
