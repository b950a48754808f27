package io.keyedstate.bridge

import java.io.{IOException, InputStream, OutputStream}
import java.net.{Socket, SocketException, SocketTimeoutException, StandardProtocolFamily, UnixDomainSocketAddress}
import java.nio.ByteBuffer
import java.nio.channels.{ClosedSelectorException, SelectionKey, Selector, SocketChannel}
import java.nio.file.Path
import java.util.concurrent.TimeUnit

/**
 * A java.net.Socket connected to the Unix domain socket `path`, with what py4j uses of one:
 * its streams, a read timeout (`setSoTimeout`: a read waiting longer fails with a
 * SocketTimeoutException, as on TCP; writes wait as long at most) and `close`, which ends a
 * blocked read or write in another thread.
 */
private[bridge] final class UnixChannelSocket(path: Path) extends Socket {
  private val channel = SocketChannel.open(StandardProtocolFamily.UNIX)
  private val readable = Selector.open()
  private val writable = Selector.open()
  @volatile private var timeoutMs = 0
  @volatile private var closed = false
  try {
    // As on a TCP socket, an interrupted thread still connects (a killed task's cleanup calls
    // reach the server); a blocking channel would close itself instead. The interrupt is kept.
    val interrupted = Thread.interrupted()
    try channel.connect(UnixDomainSocketAddress.of(path))
    finally if (interrupted) Thread.currentThread().interrupt()
    channel.configureBlocking(false)
    channel.register(readable, SelectionKey.OP_READ)
    channel.register(writable, SelectionKey.OP_WRITE)
  } catch { case e: Throwable => close(); throw e }

  private val in = new InputStream {
    override def read(): Int = {
      val one = new Array[Byte](1)
      if (read(one, 0, 1) < 0) -1 else one(0) & 0xff
    }
    override def read(b: Array[Byte], off: Int, len: Int): Int =
      if (len == 0) 0 else transfer(ByteBuffer.wrap(b, off, len), readable, "read")(channel.read)
    override def close(): Unit = UnixChannelSocket.this.close()
  }

  private val out = new OutputStream {
    override def write(b: Int): Unit = write(Array(b.toByte), 0, 1)
    override def write(b: Array[Byte], off: Int, len: Int): Unit = {
      val buf = ByteBuffer.wrap(b, off, len)
      while (buf.hasRemaining) transfer(buf, writable, "write")(channel.write)
    }
    override def close(): Unit = UnixChannelSocket.this.close()
  }

  /** One read or write that moves at least a byte (or reads the end, -1), waiting for the
   *  channel up to the timeout. As on a TCP socket, an interrupt does not end the wait (only
   *  `close` or the timeout does) and is kept for the caller: a selector returns at once while
   *  its thread is interrupted, so the flag is cleared around each wait, else the wait spins. */
  private def transfer(buf: ByteBuffer, selector: Selector, what: String)(op: ByteBuffer => Int): Int = {
    val timeout = timeoutMs
    val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeout)
    var interrupted = false
    try {
      var n = op(buf)
      while (n == 0) {
        val left = if (timeout == 0) 0L else TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())
        if (timeout > 0 && left <= 0) throw new SocketTimeoutException(s"$what timed out after $timeout ms")
        interrupted |= Thread.interrupted()
        selector.select(if (timeout == 0) 0L else math.max(1L, left))
        interrupted |= Thread.interrupted()
        if (closed) throw new SocketException("Socket closed")
        selector.selectedKeys().clear()
        n = op(buf)
      }
      n
    } catch {
      case _: ClosedSelectorException => throw new SocketException("Socket closed")
      case e: IOException if closed && !e.isInstanceOf[SocketException] => throw new SocketException("Socket closed")
    } finally if (interrupted) Thread.currentThread().interrupt()
  }

  override def getInputStream: InputStream = { if (closed) throw new SocketException("Socket is closed"); in }
  override def getOutputStream: OutputStream = { if (closed) throw new SocketException("Socket is closed"); out }
  override def setSoTimeout(timeout: Int): Unit = {
    if (timeout < 0) throw new IllegalArgumentException("timeout < 0")
    timeoutMs = timeout
  }
  override def getSoTimeout: Int = timeoutMs
  override def setSoLinger(on: Boolean, linger: Int): Unit = () // no lingering data on a local socket
  override def setTcpNoDelay(on: Boolean): Unit = ()
  override def isConnected: Boolean = true
  override def isClosed: Boolean = closed
  override def shutdownInput(): Unit = channel.shutdownInput()
  override def shutdownOutput(): Unit = channel.shutdownOutput()
  override def close(): Unit = synchronized {
    if (!closed) {
      closed = true
      Seq[java.io.Closeable](channel, readable, writable).foreach(c => try c.close() catch { case _: IOException => })
      try super.close() catch { case _: IOException => }
    }
  }
  override def toString: String = s"UnixChannelSocket[$path]"
}
