package io.keyedstate.bridge

import java.io.{Closeable, EOFException}
import java.net.{StandardProtocolFamily, UnixDomainSocketAddress}
import java.nio.ByteBuffer
import java.nio.channels.SocketChannel
import java.nio.charset.StandardCharsets
import java.nio.file.Path

/**
 * One connection of the bulk data channel: length-prefixed binary frames over a Unix domain
 * socket (GB/s, ~16-60 us per round trip, where py4j moves ~25 MB/s). The frame layout is
 * documented in `keyedstate/protocol.py`; keep the two in step. Not thread-safe: borrowed from
 * the server's pool for one call at a time.
 */
final class DataChannel(path: Path) extends Closeable {
  import DataChannel._

  private val channel = SocketChannel.open(StandardProtocolFamily.UNIX)
  channel.connect(UnixDomainSocketAddress.of(path))
  private val requestHead = ByteBuffer.allocate(9)
  private val responseHead = ByteBuffer.allocate(5)

  /** Looks one key up; null when absent. */
  def get(handle: Int, key: Array[Byte]): Array[Byte] = {
    val (status, body) = call(OpGet, handle, ByteBuffer.wrap(key))
    if (status == StatusNotFound) null else body.array()
  }

  /** Looks several keys up in one round trip; null where absent. */
  def multiGet(handle: Int, keys: Array[Array[Byte]]): Array[Array[Byte]] = {
    val req = ByteBuffer.allocate(4 + keys.map(4 + _.length).sum)
    req.putInt(keys.length)
    keys.foreach(k => req.putInt(k.length).put(k))
    req.flip()
    val (_, body) = call(OpMultiGet, handle, req)
    Array.fill(keys.length) {
      if (body.get() == 0) null else { val v = new Array[Byte](body.getInt()); body.get(v); v }
    }
  }

  /** A chunk of entries whose key starts with `prefix`, after `startAfter` (null = from start),
   *  of at most `maxBytes` and (unless 0) `maxEntries`. */
  def scan(handle: Int, prefix: Array[Byte], startAfter: Array[Byte], maxBytes: Int,
      keysOnly: Boolean = false, maxEntries: Int = 0): ScanChunk = {
    val afterLen = if (startAfter == null) 0 else 4 + startAfter.length
    val req = ByteBuffer.allocate(4 + prefix.length + 1 + afterLen + 9)
    req.putInt(prefix.length).put(prefix)
    if (startAfter == null) req.put(0.toByte) else req.put(1.toByte).putInt(startAfter.length).put(startAfter)
    req.putInt(maxBytes).put((if (keysOnly) 1 else 0).toByte).putInt(maxEntries).flip()
    val (_, body) = call(OpScan, handle, req)
    val hasMore = body.get() != 0
    val n = body.getInt()
    val keys = new Array[Array[Byte]](n)
    val values = new Array[Array[Byte]](n)
    var i = 0
    while (i < n) {
      val k = new Array[Byte](body.getInt()); body.get(k); keys(i) = k
      val v = new Array[Byte](body.getInt()); body.get(v); values(i) = v
      i += 1
    }
    ScanChunk(keys, values, hasMore)
  }

  /**
   * Ships a committed version's changelog. `behind` = queue it and return at once (write-behind;
   * returns 0); otherwise apply it first and return the store's exact key count.
   */
  def apply(handle: Int, changelog: ByteBuffer, behind: Boolean, ttlScan: Option[TtlScan] = None): Long = {
    val head = ByteBuffer.allocate(2 + 16)
    head.put(if (behind) ApplyBehind else ApplyNow)
    ttlScan match {
      case Some(t) => head.put(1.toByte).putLong(t.expireBefore).putInt(t.interval).putInt(t.budget)
      case None => head.put(0.toByte)
    }
    head.flip()
    call(OpApply, handle, head, changelog)._2.getLong()
  }

  /** What the TTL scan after the last apply found: the version it scanned, its ms, expired keys. */
  def ttlCandidates(handle: Int): TtlCandidates = {
    val (_, body) = call(OpTtlCandidates, handle)
    val version = body.getLong()
    val scanMs = body.getInt()
    val keys = Array.fill(body.getInt()) { val k = new Array[Byte](body.getInt()); body.get(k); k }
    TtlCandidates(version, scanMs, keys)
  }

  /**
   * Waits until the store has applied every shipped changelog and flushed it to its files;
   * returns the version it holds and its RocksDB directory (for [[io.keyedstate.spark.NativeReader]]).
   */
  def sync(handle: Int): (Long, String) = {
    val (_, body) = call(OpSync, handle)
    val version = body.getLong()
    (version, StandardCharsets.UTF_8.decode(body).toString)
  }

  private def call(op: Byte, handle: Int, body: ByteBuffer*): (Byte, ByteBuffer) = {
    requestHead.clear()
    requestHead.putInt(5 + body.map(_.remaining()).sum).put(op).putInt(handle).flip()
    val out = (requestHead +: body).toArray
    while (out.exists(_.hasRemaining)) channel.write(out)
    responseHead.clear()
    readFully(responseHead)
    responseHead.flip()
    val length = responseHead.getInt()
    val status = responseHead.get()
    val reply = ByteBuffer.allocate(length - 1)
    readFully(reply)
    reply.flip()
    if (status == StatusError) {
      throw new StateServerException(
        "keyedstate: " + new String(reply.array(), StandardCharsets.UTF_8))
    }
    (status, reply)
  }

  private def readFully(buf: ByteBuffer): Unit =
    while (buf.hasRemaining) {
      if (channel.read(buf) < 0) throw new EOFException("state server closed the data channel")
    }

  override def close(): Unit = try channel.close() catch { case _: Exception => }
}

final case class ScanChunk(keys: Array[Array[Byte]], values: Array[Array[Byte]], hasMore: Boolean)

/** Asks the server, every `interval` versions, to look for up to `budget` entries written at
 *  or before `expireBefore` after applying the version. */
final case class TtlScan(expireBefore: Long, interval: Int, budget: Int)

final case class TtlCandidates(version: Long, scanMs: Int, keys: Array[Array[Byte]])

object DataChannel {
  val OpGet: Byte = 1
  val OpScan: Byte = 2
  val OpApply: Byte = 3
  val OpMultiGet: Byte = 4
  val OpTtlCandidates: Byte = 5
  val OpSync: Byte = 6
  val ApplyNow: Byte = 0
  val ApplyBehind: Byte = 1
  val StatusOk: Byte = 0
  val StatusNotFound: Byte = 1
  val StatusError: Byte = 2
}
