package io.keyedstate.format

import java.nio.ByteBuffer
import java.nio.charset.StandardCharsets

/**
 * Frames of the bulk data channel (spec: FORMATS.md, "Data-channel frames"; the Python twin is
 * `keyedstate/formats/frames.py`; golden files in `tests/golden/`), big-endian:
 *
 *   request   u32 length | u8 op | u32 store handle | body    (length counts op, handle, body)
 *   response  u32 length | u8 status | body                   (length counts status, body)
 *
 *   GET        key                                   -> value | NOT_FOUND
 *   SCAN       u32 plen prefix | u8 has_after [u32 alen after] | u32 max_bytes | u8 flags (1: keys only)
 *                                                    -> u8 has_more | u32 n | (u32 klen k | u32 vlen v)*
 *   APPLY      u8 mode | u8 has_ttl [i64 expire_before | u32 interval | u32 budget] | changelog
 *                                                    -> u64 key count (0 when applied behind or held)
 *   RELEASE    u8 apply (1: apply the held changelog behind, 0: drop it) -> (empty)
 *   MULTI_GET  u32 n | (u32 klen k)*                 -> (u8 found [u32 vlen v])*
 *   TTL_CANDIDATES                                   -> i64 version | u32 scan ms | u32 n | (u32 klen k)*
 *   SYNC                                             -> i64 version | RocksDB directory (UTF-8)
 *   HELLO      u16 protocol version | secret         -> (empty)    (the first frame of a connection)
 *
 * An ERROR reply carries a UTF-8 message. Request bodies are built here; replies are parsed
 * here with every length checked against the reply before anything is allocated.
 */
object Frames {
  val OpGet: Byte = 1
  val OpScan: Byte = 2
  val OpApply: Byte = 3
  val OpMultiGet: Byte = 4
  val OpTtlCandidates: Byte = 5
  val OpSync: Byte = 6
  val OpHello: Byte = 7
  val OpRelease: Byte = 8
  /** Version 2 added HELLO; version 3 the HOLD apply mode and RELEASE. */
  val ProtocolVersion: Int = 3
  /** Apply before replying (the writer needs the exact key count). */
  val ApplyNow: Byte = 0
  /** Queue, reply at once, apply in the background (write-behind). */
  val ApplyBehind: Byte = 1
  /** Keep it unapplied until a RELEASE says whether its checkpoint file became durable. */
  val ApplyHold: Byte = 2
  val StatusOk: Byte = 0
  val StatusNotFound: Byte = 1
  val StatusError: Byte = 2
  val RequestHeadBytes = 9
  val ResponseHeadBytes = 5

  def requestHead(op: Byte, handle: Int, bodyBytes: Long): ByteBuffer = {
    if (bodyBytes > Int.MaxValue - 5) throw new FrameException(s"a frame of $bodyBytes bytes is too large")
    ByteBuffer.allocate(RequestHeadBytes).putInt(5 + bodyBytes.toInt).put(op).putInt(handle).flip()
  }

  /** The body of the HELLO every connection starts with (handle 0): the data-channel secret. */
  def helloRequest(secret: Array[Byte]): ByteBuffer =
    ByteBuffer.allocate(2 + secret.length).putShort(ProtocolVersion.toShort).put(secret).flip()

  def multiGetRequest(keys: Array[Array[Byte]]): ByteBuffer = {
    val req = ByteBuffer.allocate(4 + keys.map(4 + _.length).sum)
    req.putInt(keys.length)
    keys.foreach(k => req.putInt(k.length).put(k))
    req.flip()
  }

  def scanRequest(prefix: Array[Byte], startAfter: Array[Byte], maxBytes: Int, keysOnly: Boolean): ByteBuffer = {
    val afterLen = if (startAfter == null) 0 else 4 + startAfter.length
    val req = ByteBuffer.allocate(4 + prefix.length + 1 + afterLen + 5)
    req.putInt(prefix.length).put(prefix)
    if (startAfter == null) req.put(0.toByte) else req.put(1.toByte).putInt(startAfter.length).put(startAfter)
    req.putInt(maxBytes).put((if (keysOnly) 1 else 0).toByte).flip()
  }

  /** The head of an APPLY body; the changelog follows it. */
  def applyHead(mode: Byte, ttlScan: Option[TtlScan]): ByteBuffer = {
    if (mode != ApplyNow && mode != ApplyBehind && mode != ApplyHold) throw new FrameException(s"unknown apply mode $mode")
    val head = ByteBuffer.allocate(2 + 16)
    head.put(mode)
    ttlScan match {
      case Some(t) => head.put(1.toByte).putLong(t.expireBefore).putInt(t.interval).putInt(t.budget)
      case None => head.put(0.toByte)
    }
    head.flip()
  }

  /** The body of a RELEASE: apply the held changelog (true) or drop it. */
  def releaseRequest(apply: Boolean): ByteBuffer = ByteBuffer.allocate(1).put((if (apply) 1 else 0).toByte).flip()

  def multiGetReply(body: ByteBuffer, expected: Int): Array[Array[Byte]] = {
    val out = Array.fill(expected) { if (u8(body) == 0) null else sized(body) }
    done(body)
    out
  }

  def scanReply(body: ByteBuffer): ScanChunk = {
    val hasMore = u8(body) != 0
    val n = count(body, 8)
    val keys = new Array[Array[Byte]](n)
    val values = new Array[Array[Byte]](n)
    var i = 0
    while (i < n) { keys(i) = sized(body); values(i) = sized(body); i += 1 }
    done(body)
    ScanChunk(keys, values, hasMore)
  }

  def countReply(body: ByteBuffer): Long = { val n = long(body); done(body); n }

  def ttlCandidatesReply(body: ByteBuffer): TtlCandidates = {
    val version = long(body)
    need(body, 4)
    val scanMs = body.getInt()
    val n = count(body, 4)
    val keys = Array.fill(n)(sized(body))
    done(body)
    TtlCandidates(version, scanMs, keys)
  }

  def syncReply(body: ByteBuffer): (Long, String) = {
    val version = long(body)
    (version, StandardCharsets.UTF_8.decode(body).toString)
  }

  private def need(body: ByteBuffer, n: Int): Unit =
    if (n < 0 || body.remaining() < n) {
      throw new FrameException(s"malformed reply: a field of $n bytes at byte ${body.position()} overruns the " +
        s"${body.limit()}-byte reply")
    }

  private def u8(body: ByteBuffer): Int = { need(body, 1); body.get() & 0xFF }
  private def long(body: ByteBuffer): Long = { need(body, 8); body.getLong() }

  /** A count of items taking at least `minBytes` each, checked against what is left. */
  private def count(body: ByteBuffer, minBytes: Int): Int = {
    need(body, 4)
    val n = body.getInt()
    if (n < 0 || n.toLong * minBytes > body.remaining()) {
      throw new FrameException(s"malformed reply: $n items cannot fit in ${body.remaining()} bytes")
    }
    n
  }

  private def sized(body: ByteBuffer): Array[Byte] = {
    need(body, 4)
    val n = body.getInt()
    need(body, n)
    val out = new Array[Byte](n)
    body.get(out)
    out
  }

  private def done(body: ByteBuffer): Unit =
    if (body.hasRemaining) throw new FrameException(s"malformed reply: ${body.remaining()} unexpected bytes at its end")
}
