package io.keyedstate.bridge

import java.io.{Closeable, EOFException, IOException}
import java.net.{StandardProtocolFamily, UnixDomainSocketAddress}
import java.nio.ByteBuffer
import java.nio.channels.SocketChannel
import java.nio.charset.StandardCharsets
import java.nio.file.Path
import java.util.concurrent.{ConcurrentHashMap, TimeUnit}

import io.keyedstate.format.{Frames, ScanChunk, SplitChangelog, TtlCandidates, TtlScan}

/**
 * One connection of the bulk data channel: [[Frames]] over a Unix domain socket (GB/s, ~16-60 us
 * per round trip, where py4j moves ~25 MB/s). It starts with a HELLO carrying the server's
 * data-channel secret. Not thread-safe: borrowed from the server's pool for one call at a time.
 *
 * Every exchange must complete within `timeoutMs`: a watchdog thread closes a channel whose
 * exchange has run longer, which ends the blocked read or write, and the call fails with a
 * [[DataChannelTimeoutException]]. The hot path pays two volatile writes and a clock read per
 * call for it, no system call.
 */
final class DataChannel(path: Path, secret: Array[Byte], timeoutMs: Long) extends Closeable {
  import Frames._

  private val timeoutNanos = TimeUnit.MILLISECONDS.toNanos(math.max(1L, timeoutMs))
  @volatile private var callStart = 0L
  @volatile private var inCall = false
  @volatile private var expired = false
  private val channel = SocketChannel.open(StandardProtocolFamily.UNIX)
  private val responseHead = ByteBuffer.allocate(ResponseHeadBytes)
  DataChannel.Watchdog.watch(this)
  try {
    timed { channel.connect(UnixDomainSocketAddress.of(path)) }
    call(OpHello, 0, helloRequest(secret))
  } catch { case e: Throwable => close(); throw e }

  def isOpen: Boolean = channel.isOpen

  /** Looks one key up; null when absent. */
  def get(handle: Int, key: Array[Byte]): Array[Byte] = {
    val (status, body) = call(OpGet, handle, ByteBuffer.wrap(key))
    if (status == StatusNotFound) null else body.array()
  }

  /** Looks several keys up in one round trip; null where absent. */
  def multiGet(handle: Int, keys: Array[Array[Byte]]): Array[Array[Byte]] =
    multiGetReply(call(OpMultiGet, handle, multiGetRequest(keys))._2, keys.length)

  /** About `maxBytes` of entries whose key starts with `prefix`, after `startAfter` (null = from the start). */
  def scan(handle: Int, prefix: Array[Byte], startAfter: Array[Byte], maxBytes: Int, keysOnly: Boolean): ScanChunk =
    scanReply(call(OpScan, handle, scanRequest(prefix, startAfter, maxBytes, keysOnly))._2)

  /**
   * Ships a committed version's changelog. `mode` ([[Frames.ApplyNow]]): apply it first and
   * return the store's exact key count; [[Frames.ApplyBehind]]: queue it and return 0 at once
   * (write-behind); [[Frames.ApplyHold]]: keep it unapplied until [[release]].
   */
  def apply(handle: Int, changelog: ByteBuffer, mode: Byte, ttlScan: Option[TtlScan]): Long =
    countReply(call(OpApply, handle, applyHead(mode, ttlScan), changelog)._2)

  /** [[apply]] of a commit's changelog, held split: its format-1 bytes are joined into the
   *  socket a chunk at a time, never into one array. */
  def apply(handle: Int, changelog: SplitChangelog, mode: Byte, ttlScan: Option[TtlScan]): Long = {
    val head = applyHead(mode, ttlScan)
    countReply(timed {
      writeAll(Array(requestHead(OpApply, handle, head.remaining() + changelog.length), head))
      changelog.writeFormat1(chunk, c => writeAll(Array(c)))
      reply()
    }._2)
  }

  /** Applies (behind) or drops the changelog an [[apply]] in [[Frames.ApplyHold]] mode left held. */
  def release(handle: Int, apply: Boolean): Unit = call(OpRelease, handle, releaseRequest(apply))

  /** What the TTL scan after the last apply found: the version it scanned, its ms, expired keys. */
  def ttlCandidates(handle: Int): TtlCandidates = ttlCandidatesReply(call(OpTtlCandidates, handle)._2)

  /**
   * Waits until the store has applied every shipped changelog and flushed it to its files;
   * returns the version it holds and its RocksDB directory (for the native reader).
   */
  def sync(handle: Int): (Long, String) = syncReply(call(OpSync, handle)._2)

  private def call(op: Byte, handle: Int, body: ByteBuffer*): (Byte, ByteBuffer) = timed {
    writeAll((requestHead(op, handle, body.map(_.remaining().toLong).sum) +: body).toArray) // one write when small
    reply()
  }

  private def writeAll(out: Array[ByteBuffer]): Unit = while (out.exists(_.hasRemaining)) channel.write(out)

  /** On the heap: the join copies records into its array (see [[SplitChangelog.writeFormat1]]). */
  private lazy val chunk = ByteBuffer.allocate(DataChannel.ChunkBytes)

  private def reply(): (Byte, ByteBuffer) = {
    responseHead.clear()
    readFully(responseHead)
    responseHead.flip()
    val length = responseHead.getInt()
    val status = responseHead.get()
    // A u32 above 2^31 reads as negative; a Java array holds at most Int.MaxValue - 8 bytes.
    if (length < 1 || length > Int.MaxValue - 8) {
      throw new StateServerException(s"keyedstate: malformed reply of length ${length & 0xFFFFFFFFL} from the state server")
    }
    val reply = ByteBuffer.allocate(length - 1)
    readFully(reply)
    reply.flip()
    if (status == StatusError) {
      throw new StateServerException("keyedstate: " + new String(reply.array(), StandardCharsets.UTF_8))
    }
    (status, reply)
  }

  /** Runs one exchange under the watchdog's eye; an exchange it cut off fails as a timeout. */
  private def timed[T](f: => T): T = {
    callStart = System.nanoTime()
    inCall = true
    try f
    catch { case e: IOException if expired => throw new DataChannelTimeoutException(timeoutMs).initCause(e) }
    finally inCall = false
  }

  /** Called by the watchdog: closes the channel if its exchange has run past the timeout. */
  private def expireIfLate(now: Long): Unit =
    if (inCall && now - callStart > timeoutNanos && !expired) {
      expired = true
      try channel.close() catch { case _: Exception => }
    }

  private def readFully(buf: ByteBuffer): Unit =
    while (buf.hasRemaining) {
      if (channel.read(buf) < 0) throw new EOFException("state server closed the data channel")
    }

  override def close(): Unit = {
    DataChannel.Watchdog.unwatch(this)
    try channel.close() catch { case _: Exception => }
  }
}

object DataChannel {
  /** Bytes of a streamed request body written at a time. */
  val ChunkBytes: Int = 1 << 18

  /** One daemon thread for every data channel of the JVM: checks in-flight exchanges ten times
   *  a second (the timeout is seconds to minutes; a late check costs at most 100 ms more). */
  private object Watchdog extends Runnable {
    private val channels = ConcurrentHashMap.newKeySet[DataChannel]()
    private lazy val thread: Thread = {
      val t = new Thread(this, "keyedstate-data-channel-watchdog")
      t.setDaemon(true)
      t.start()
      t
    }

    def watch(c: DataChannel): Unit = { channels.add(c); thread }
    def unwatch(c: DataChannel): Unit = channels.remove(c)

    override def run(): Unit =
      while (true) {
        try {
          Thread.sleep(100)
          val now = System.nanoTime()
          channels.forEach(c => c.expireIfLate(now))
        } catch { case _: InterruptedException => return; case _: Throwable => }
      }
  }
}
