package io.keyedstate.bridge

import java.io.{Closeable, EOFException}
import java.net.{StandardProtocolFamily, UnixDomainSocketAddress}
import java.nio.ByteBuffer
import java.nio.channels.SocketChannel
import java.nio.charset.StandardCharsets
import java.nio.file.Path

import io.keyedstate.format.{Frames, ScanChunk, TtlCandidates, TtlScan}

/**
 * One connection of the bulk data channel: [[Frames]] over a Unix domain socket (GB/s, ~16-60 us
 * per round trip, where py4j moves ~25 MB/s). Not thread-safe: borrowed from the server's pool
 * for one call at a time.
 */
final class DataChannel(path: Path) extends Closeable {
  import Frames._

  private val channel = SocketChannel.open(StandardProtocolFamily.UNIX)
  channel.connect(UnixDomainSocketAddress.of(path))
  private val responseHead = ByteBuffer.allocate(ResponseHeadBytes)

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
   * Ships a committed version's changelog. `behind` = queue it and return at once (write-behind;
   * returns 0); otherwise apply it first and return the store's exact key count.
   */
  def apply(handle: Int, changelog: ByteBuffer, behind: Boolean, ttlScan: Option[TtlScan]): Long =
    countReply(call(OpApply, handle, applyHead(behind, ttlScan), changelog)._2)

  /** What the TTL scan after the last apply found: the version it scanned, its ms, expired keys. */
  def ttlCandidates(handle: Int): TtlCandidates = ttlCandidatesReply(call(OpTtlCandidates, handle)._2)

  /**
   * Waits until the store has applied every shipped changelog and flushed it to its files;
   * returns the version it holds and its RocksDB directory (for the native reader).
   */
  def sync(handle: Int): (Long, String) = syncReply(call(OpSync, handle)._2)

  private def call(op: Byte, handle: Int, body: ByteBuffer*): (Byte, ByteBuffer) = {
    val out = (requestHead(op, handle, body.map(_.remaining().toLong).sum) +: body).toArray
    while (out.exists(_.hasRemaining)) channel.write(out)
    responseHead.clear()
    readFully(responseHead)
    responseHead.flip()
    val length = responseHead.getInt()
    val status = responseHead.get()
    if (length < 1) throw new StateServerException(s"keyedstate: malformed reply of length $length from the state server")
    val reply = ByteBuffer.allocate(length - 1)
    readFully(reply)
    reply.flip()
    if (status == StatusError) {
      throw new StateServerException("keyedstate: " + new String(reply.array(), StandardCharsets.UTF_8))
    }
    (status, reply)
  }

  private def readFully(buf: ByteBuffer): Unit =
    while (buf.hasRemaining) {
      if (channel.read(buf) < 0) throw new EOFException("state server closed the data channel")
    }

  override def close(): Unit = try channel.close() catch { case _: Exception => }
}
