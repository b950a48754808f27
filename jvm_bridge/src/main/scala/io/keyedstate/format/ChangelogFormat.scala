package io.keyedstate.format

import java.io.OutputStream
import java.nio.{ByteBuffer, ByteOrder}
import java.nio.charset.StandardCharsets
import java.util.zip.CRC32

import com.fasterxml.jackson.databind.ObjectMapper
import com.github.luben.zstd.Zstd

/**
 * The changelog: one version's writes (spec: FORMATS.md, "Changelog"; the Python twin is
 * `keyedstate/formats/changelog.py`; golden files in `tests/golden/`). Format 1, big-endian:
 *
 *   header   8s magic "KSCHLOG1" | u16 format version | u64 version | u32 key groups
 *   record   u8 op | u32 key length | key | (puts only) u32 value length | value
 *   trailer  u8 0xFF | u64 record count | u32 CRC-32 of header and records
 *
 * Ops carry what the writer knew of the key's existence before the record (see `Op*`), so that
 * the reader keeps an exact key count without a read when the writer knew. Format 2, what the
 * checkpoint holds, wraps a format-1 changelog:
 *
 *   header   8s magic "KSCHLOG2" | u16 format version (2) | u8 codec | u32 meta length | meta
 *            | u32 CRC-32 of the header before it
 *   meta     UTF-8 JSON: "version", "keyGroups", then optional "keyLayout", "uniqueId", "lineage",
 *            "fromEmpty" (true: the version was written from empty, by an offline writer), "runId"
 *            (the query run that committed the version)
 *   body     the format-1 changelog C: as is (codec 0); one zstd frame with its content size
 *            (codec 1); or, codec 2, split in two before compression: G = the first 4 bytes of
 *            every record's key (its key group) in record order, R = C with those 4 bytes cut out
 *            of every key (key lengths unchanged), body = u32 |zstd(G)| | zstd(G) | zstd(R)
 *
 * Key groups are near random; apart from them the records compress well, so files end up
 * smaller than with codec 1. Loads turn files back into format 1 ([[inner]]) in
 * the JVM before the state server replays them.
 */
object ChangelogFormat {
  val Magic: Array[Byte] = "KSCHLOG1".getBytes(StandardCharsets.US_ASCII)
  val FormatVersion = 1
  val HeaderBytes = 22
  val TrailerBytes = 13
  val End: Byte = 0xFF.toByte
  val MagicV2: Array[Byte] = "KSCHLOG2".getBytes(StandardCharsets.US_ASCII)
  val FormatVersionV2 = 2
  val CodecNone = 0
  val CodecZstd = 1
  val CodecZstdSplit = 2
  /** Measured on changelogs: level 1 compresses them best and fastest (levels 3+ do worse). */
  val ZstdLevel = 1
  private[format] val HeaderV2Bytes = 15
  /** The bytes every changelog file a commit writes begins with (format 2's magic and version). */
  def filePrefix: Array[Byte] =
    java.nio.ByteBuffer.allocate(MagicV2.length + 2).put(MagicV2).putShort(FormatVersionV2.toShort).array()
  private val Json = new ObjectMapper()

  val OpPut: Byte = 1 // existence unknown
  val OpDelete: Byte = 2 // existence unknown
  val OpPutNew: Byte = 3
  val OpPutExisting: Byte = 4
  val OpDeleteExisting: Byte = 5

  def isPut(op: Byte): Boolean = op == OpPut || op == OpPutNew || op == OpPutExisting
  def isDelete(op: Byte): Boolean = op == OpDelete || op == OpDeleteExisting

  /** Refines an op of unknown existence with what a read learnt (null: nothing); 0 drops the
   *  record (deleting a key known to be absent changes nothing). */
  def settle(op: Byte, existed: java.lang.Boolean): Byte =
    if (existed == null) op
    else if (op == OpPut) { if (existed) OpPutExisting else OpPutNew }
    else if (op == OpDelete) { if (existed) OpDeleteExisting else 0.toByte }
    else op

  /**
   * Writes one changelog to `out`: the header now, records as they come, the trailer on
   * [[finish]]. Buffers 64 KiB at a time and checksums what it passes on.
   */
  final class Writer(out: OutputStream, version: Long, keyGroups: Int) {
    private val buf = ByteBuffer.allocate(1 << 16).order(ByteOrder.BIG_ENDIAN)
    private val crc = new CRC32()
    private var records = 0L
    private var written = 0L
    buf.put(Magic).putShort(FormatVersion.toShort).putLong(version).putInt(keyGroups)

    def put(op: Byte, key: Array[Byte], value: Array[Byte]): Unit = {
      require(isPut(op), s"op $op is not a put")
      header(op, key)
      putInt(value.length)
      putBytes(value)
      records += 1
    }

    def delete(op: Byte, key: Array[Byte]): Unit = {
      require(isDelete(op), s"op $op is not a delete")
      header(op, key)
      records += 1
    }

    def recordCount: Long = records
    /** Bytes written so far (header and records, trailer excluded until finished). */
    def bytesWritten: Long = written + buf.position()

    /** Writes the trailer and flushes; `out` stays open. */
    def finish(): Unit = {
      flushBuffer()
      buf.put(End).putLong(records).putInt(crc.getValue.toInt)
      out.write(buf.array(), 0, buf.position())
      written += buf.position()
      buf.clear()
      out.flush()
    }

    private def header(op: Byte, key: Array[Byte]): Unit = {
      room(5)
      buf.put(op).putInt(key.length)
      putBytes(key)
    }

    private def putInt(v: Int): Unit = { room(4); buf.putInt(v) }

    private def putBytes(bytes: Array[Byte]): Unit = {
      if (bytes.length > buf.remaining()) flushBuffer()
      if (bytes.length > buf.remaining()) {
        crc.update(bytes, 0, bytes.length)
        out.write(bytes)
        written += bytes.length
      } else buf.put(bytes)
    }

    private def room(n: Int): Unit = if (buf.remaining() < n) flushBuffer()

    private def flushBuffer(): Unit = {
      crc.update(buf.array(), 0, buf.position())
      out.write(buf.array(), 0, buf.position())
      written += buf.position()
      buf.clear()
    }
  }

  /** At most this many bytes per changelog (one Java array). */
  val MaxBytes: Long = Int.MaxValue - 64L

  /** At most this many bytes of format 2's metadata, written or read (FORMATS.md; Python:
   *  `changelog.MAX_META_BYTES`); the header-only read allocates no more than this. */
  val MaxMetaBytes: Int = 16 << 20

  /** A changelog written into memory record by record, split as codec 2 stores it
   *  ([[SplitChangelog]]; fails beyond [[MaxBytes]]); starts with room for `expectedBytes` in
   *  `expectedRecords` records, so that a changelog as large as the last one is not copied while
   *  it grows. */
  final class InMemoryWriter(version: Long, keyGroups: Int, expectedBytes: Long = 0, expectedRecords: Long = 0) {
    private val out = new SplitChangelog.Splitter(expectedBytes, expectedRecords)
    val writer = new Writer(out, version, keyGroups)
    /** Writes the trailer; the changelog, split. */
    def finish(): SplitChangelog = { writer.finish(); out.finish() }
  }

  /** One record; `value` is null for deletes. */
  final case class Record(op: Byte, key: Array[Byte], value: Array[Byte])

  /** A format-2 file of the format-1 changelog `inner`, compressed with `codec`. */
  def compress(inner: ByteBuffer, meta: ChangelogMeta, codec: Int = CodecZstdSplit): ByteBuffer = codec match {
    case CodecZstdSplit => compress(SplitChangelog.of(inner), meta, 0L)
    case CodecNone | CodecZstd =>
      val src = inner.duplicate()
      val head = src.duplicate()
      head.position(head.position() + 10)
      val (a, off, len) = (src.array(), src.arrayOffset() + src.position(), src.remaining())
      val bound = if (codec == CodecNone) len.toLong else Zstd.compressBound(len.toLong)
      val (file, bodyStart) = headed(head.getLong(), head.getInt(), meta, codec, bound)
      val end =
        if (codec == CodecNone) file.put(a, off, len).position()
        else bodyStart + ChangelogCodecs.zstdInto(file.array(), bodyStart, a, off, len)
      file.position(0).limit(end)
      file
    case other => throw new IllegalArgumentException(s"unknown changelog codec $other")
  }

  /**
   * A format-2 file of a split changelog, codec 2: its two parts are compressed where they lie,
   * into a file buffer of `expectedBytes` (the last file's size and a margin: a buffer of the
   * worst case, compressBound, would be as large as the changelog itself), or, should the body
   * not fit, of the worst case.
   */
  def compress(log: SplitChangelog, meta: ChangelogMeta, expectedBytes: Long): ByteBuffer = {
    val (g, gLength) = log.groupBytes
    val (r, rLength) = log.restBytes
    val bound = 4 + Zstd.compressBound(gLength.toLong) + Zstd.compressBound(rLength.toLong)
    def attempt(room: Long): Option[ByteBuffer] = {
      val (file, bodyStart) = headed(log.version, log.keyGroups, meta, CodecZstdSplit, room, mayShrink = true)
      val dst = file.array()
      val gBytes = ChangelogCodecs.zstdIntoIfRoom(dst, bodyStart + 4, g, 0, gLength)
      if (gBytes < 0) return None
      file.putInt(bodyStart, gBytes)
      val rBytes = ChangelogCodecs.zstdIntoIfRoom(dst, bodyStart + 4 + gBytes, r, 0, rLength)
      if (rBytes < 0) return None
      file.position(0).limit(bodyStart + 4 + gBytes + rBytes)
      Some(file)
    }
    (if (expectedBytes > 0 && expectedBytes < bound) attempt(expectedBytes) else None).orElse(attempt(bound))
      .getOrElse(throw new IllegalStateException(s"keyedstate: a compressed changelog would exceed $MaxBytes bytes; at most 2 GB per commit"))
  }

  /** A file buffer with format 2's header written and room for `bodyBytes` (`mayShrink`: or as
   *  much of it as one array holds, for a body that may well need less); where the body starts. */
  private def headed(version: Long, keyGroups: Int, meta: ChangelogMeta, codec: Int, bodyBytes: Long,
      mayShrink: Boolean = false): (ByteBuffer, Int) = {
    val tree = ChangelogMeta.tree(version, keyGroups, meta)
    val metaBytes = Json.writeValueAsBytes(tree)
    if (metaBytes.length > MaxMetaBytes) {
      throw new IllegalStateException(s"keyedstate: a changelog's metadata would be ${metaBytes.length} bytes, at most $MaxMetaBytes")
    }
    val bodyStart = HeaderV2Bytes + metaBytes.length + 4
    val room = if (mayShrink) math.min(bodyBytes, MaxBytes - bodyStart) else bodyBytes
    if (bodyStart + room > MaxBytes) {
      throw new IllegalStateException(s"keyedstate: a compressed changelog would exceed $MaxBytes bytes; at most 2 GB per commit")
    }
    val file = ByteBuffer.allocate((bodyStart + room).toInt)
    file.put(MagicV2).putShort(FormatVersionV2.toShort).put(codec.toByte).putInt(metaBytes.length).put(metaBytes)
    val crc = new CRC32()
    crc.update(file.array(), 0, file.position())
    file.putInt(crc.getValue.toInt)
    (file, bodyStart)
  }

  /** A changelog whose framing and checksum were checked. */
  final class Changelog private[format] (val version: Long, val keyGroups: Int, val recordCount: Long,
      data: Array[Byte], source: String, val meta: ChangelogMeta) {
    /** The format-1 bytes. */
    private[format] def bytes: Array[Byte] = data
    /** Every record in order ([[ChangelogRecords]]). */
    def iterator: Iterator[Record] = new ChangelogRecords(data, recordCount, source)
  }

  /** Checks framing and checksum of a changelog of either format ([[ChangelogReader]]). */
  def read(data: Array[Byte], source: String): Changelog = ChangelogReader.read(data, source)

  /** [[ChangelogReader.readMeta]]: the metadata from a changelog's first bytes. */
  def readMeta(head: Array[Byte], source: String): Either[Int, ChangelogMeta] = ChangelogReader.readMeta(head, source)

  /** The format-1 changelog inside a changelog file of either format, its framing and CRC
   *  checked: what the state server replays (and checks record by record). */
  def inner(data: Array[Byte], source: String): Array[Byte] = read(data, source).bytes

  /** [[inner]], and the changelog's metadata. */
  def innerAndMeta(data: Array[Byte], source: String): (Array[Byte], ChangelogMeta) = {
    val log = read(data, source)
    (log.bytes, log.meta)
  }
}
