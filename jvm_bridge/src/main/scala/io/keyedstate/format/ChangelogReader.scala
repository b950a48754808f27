package io.keyedstate.format

import java.nio.ByteBuffer
import java.util.zip.CRC32

import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.JsonNode

import ChangelogFormat._

/**
 * Reads a changelog file of either format (spec: FORMATS.md, "Changelog"; the layouts are in
 * [[ChangelogFormat]]): framing, header and trailer checksums, metadata and its limits. Every
 * refusal names `source` and is a [[CorruptChangelogException]].
 */
object ChangelogReader {
  /** Format 2's metadata length from a header's bytes 11..14, refused beyond [[MaxMetaBytes]]. */
  private def metaLengthOf(head: Array[Byte], source: String): Int = {
    val metaLength = ByteBuffer.wrap(head, 11, 4).getInt()
    if (metaLength < 0 || metaLength > MaxMetaBytes) {
      throw new CorruptChangelogException(s"$source is corrupt (metadata of ${metaLength & 0xFFFFFFFFL} bytes, " +
        s"at most $MaxMetaBytes)")
    }
    metaLength
  }

  /** Checks framing and checksum of a changelog of either format; `source` names the file in errors. */
  def read(data: Array[Byte], source: String): Changelog =
    if (data.length >= 8 && java.util.Arrays.equals(data, 0, 8, MagicV2, 0, 8)) readV2(data, source)
    else readV1(data, source, ChangelogMeta())

  /**
   * The metadata of a changelog from its first bytes (format 2: the header; format 1 has none),
   * and how many bytes the header needs (more than given: read that many and ask again).
   */
  def readMeta(head: Array[Byte], source: String): Either[Int, ChangelogMeta] =
    if (head.length < 8 || !java.util.Arrays.equals(head, 0, 8, MagicV2, 0, 8)) Right(ChangelogMeta())
    else if (head.length < HeaderV2Bytes) Left(HeaderV2Bytes)
    else {
      val metaLength = metaLengthOf(head, source)
      val needed = HeaderV2Bytes + metaLength + 4
      if (head.length < needed) Left(needed) else Right(checkHeader(head, source)._3)
    }

  /** Format 2's header: (codec, where the body starts, metadata), checked against its CRC. */
  private def checkHeader(data: Array[Byte], source: String): (Int, Int, ChangelogMeta, JsonNode) = {
    if (data.length < HeaderV2Bytes + 4) throw new CorruptChangelogException(s"$source is truncated (${data.length} bytes)")
    val head = ByteBuffer.wrap(data)
    head.position(8)
    val format = head.getShort() & 0xFFFF
    if (format != FormatVersionV2) {
      throw new CorruptChangelogException(s"$source has changelog format version $format; this keyedstate reads formats 1 and 2")
    }
    val codec = head.get() & 0xFF
    val metaLength = metaLengthOf(data, source)
    val headEnd = HeaderV2Bytes.toLong + metaLength
    if (headEnd + 4 > data.length) {
      throw new CorruptChangelogException(s"$source is truncated (${data.length} bytes, header of ${headEnd + 4})")
    }
    val crc = new CRC32()
    crc.update(data, 0, headEnd.toInt)
    if (crc.getValue.toInt != ByteBuffer.wrap(data, headEnd.toInt, 4).getInt()) {
      throw new CorruptChangelogException(s"$source is corrupt (header CRC-32 mismatch)")
    }
    val meta = try CheckpointLayout.JsonReader.readTree(CheckpointLayout.utf8(data, HeaderV2Bytes, metaLength)) catch {
      case NonFatal(e) => throw new CorruptChangelogException(s"$source has unreadable metadata (${e.getMessage})")
    }
    val parsed = ChangelogMeta.parse(meta, source)
    (codec, headEnd.toInt + 4, parsed, meta)
  }

  private def readV2(data: Array[Byte], source: String): Changelog = {
    val (codec, bodyStart, parsed, meta) = checkHeader(data, source)
    val inner = codec match {
      case CodecNone => java.util.Arrays.copyOfRange(data, bodyStart, data.length)
      case CodecZstd => ChangelogCodecs.unzstd(data, bodyStart, data.length - bodyStart, source)
      case CodecZstdSplit =>
        if (data.length - bodyStart < 4) throw new CorruptChangelogException(s"$source is truncated (${data.length} bytes)")
        val groupsLength = ByteBuffer.wrap(data, bodyStart, 4).getInt()
        if (groupsLength < 0 || bodyStart + 4L + groupsLength > data.length) {
          throw new CorruptChangelogException(s"$source is truncated or corrupt (key groups of $groupsLength bytes)")
        }
        val groups = ChangelogCodecs.unzstd(data, bodyStart + 4, groupsLength, source)
        ChangelogCodecs.joinKeyGroups(groups, ChangelogCodecs.unzstd(data, bodyStart + 4 + groupsLength, data.length - bodyStart - 4 - groupsLength, source), source)
      case other => throw new CorruptChangelogException(s"$source uses compression codec $other; this keyedstate reads " +
        "0 (none), 1 (zstd) and 2 (zstd, key groups apart)")
    }
    val log = readV1(inner, source, parsed)
    // integers within Long and Int: 3.0, "3" or a larger number (whose low bits may match) is no match
    val (version, keyGroups) = (meta.path("version"), meta.path("keyGroups"))
    if (!version.isIntegralNumber || !version.canConvertToLong || !keyGroups.isIntegralNumber ||
        !keyGroups.canConvertToInt || log.version != version.asLong() || log.keyGroups != keyGroups.asInt()) {
      throw new CorruptChangelogException(s"$source: its header says version ${meta.path("version")} with " +
        s"${meta.path("keyGroups")} key groups, its records version ${log.version} with ${log.keyGroups}: corrupt")
    }
    log
  }

  private def readV1(data: Array[Byte], source: String, meta: ChangelogMeta): Changelog = {
    if (data.length < HeaderBytes || !java.util.Arrays.equals(data, 0, 8, Magic, 0, 8)) {
      throw new CorruptChangelogException(s"$source is not a keyedstate changelog (bad magic; written by another " +
        "state store provider, or corrupt)")
    }
    val head = ByteBuffer.wrap(data)
    head.position(8)
    val format = head.getShort() & 0xFFFF
    if (format != FormatVersion) {
      throw new CorruptChangelogException(s"$source has changelog format version $format; this keyedstate reads " +
        "formats 1 and 2")
    }
    val version = head.getLong()
    val keyGroups = head.getInt()
    if (data.length < HeaderBytes + TrailerBytes) {
      throw new CorruptChangelogException(s"$source is truncated (${data.length} bytes)")
    }
    val trailer = ByteBuffer.wrap(data, data.length - TrailerBytes, TrailerBytes)
    val end = trailer.get()
    val count = trailer.getLong()
    val expected = trailer.getInt()
    val crc = new CRC32()
    crc.update(data, 0, data.length - TrailerBytes)
    if (end != End || crc.getValue.toInt != expected) {
      throw new CorruptChangelogException(s"$source is truncated or corrupt (trailer or CRC-32 mismatch, " +
        s"${data.length} bytes)")
    }
    if (keyGroups < 0) { // a u32 field holding 0..2^31-1 (FORMATS.md; Python's _decode_v1 refuses the same)
      throw new CorruptChangelogException(s"$source is corrupt (${keyGroups & 0xFFFFFFFFL} key groups in its header, " +
        "at most 2147483647)")
    }
    if (version < 0 || count < 0) { // u64 fields holding 0..2^63-1 (Python's _decode_v1 refuses the same)
      throw new CorruptChangelogException(s"$source is corrupt (version ${java.lang.Long.toUnsignedString(version)}, " +
        s"${java.lang.Long.toUnsignedString(count)} records: each at most 9223372036854775807)")
    }
    new Changelog(version, keyGroups, count, data, source, meta)
  }
}
