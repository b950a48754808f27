package io.keyedstate.format

import java.nio.ByteBuffer

import com.github.luben.zstd.Zstd

import io.keyedstate.format.ChangelogFormat.{isPut, HeaderBytes, MaxBytes, TrailerBytes, ZstdLevel}

/**
 * The body codecs of changelog format 2 (spec: FORMATS.md, "Changelog"): zstd frames with their
 * content size, and codec 2's split of a format-1 changelog into its key groups and the rest.
 * Kept apart from [[ChangelogFormat]], which owns the framing, the header and the record reader.
 */
private[format] object ChangelogCodecs {
  /** Compresses `src[offset, offset + length)` into `dst` at `at` (room for compressBound); the bytes written. */
  def zstdInto(dst: Array[Byte], at: Int, src: Array[Byte], offset: Int, length: Int): Int = {
    val n = Zstd.compressByteArray(dst, at, dst.length - at, src, offset, length, ZstdLevel)
    if (Zstd.isError(n)) throw new IllegalStateException(s"keyedstate: zstd failed: ${Zstd.getErrorName(n)}")
    n.toInt
  }

  /** Codec 2's split of a format-1 changelog: (key groups, the rest, the rest's length). */
  def splitKeyGroups(inner: ByteBuffer): (Array[Byte], Array[Byte], Int) = {
    val b = inner.duplicate()
    val data = b.array()
    val start = b.arrayOffset() + b.position()
    val end = start + b.remaining() - TrailerBytes
    val count = ByteBuffer.wrap(data, end + 1, 8).getLong()
    val groups = new Array[Byte]((4 * count).toInt)
    val rest = new Array[Byte](b.remaining() - groups.length)
    System.arraycopy(data, start, rest, 0, HeaderBytes)
    var pos = start + HeaderBytes
    var out = HeaderBytes
    var g = 0
    val view = ByteBuffer.wrap(data)
    while (pos < end) {
      val keyStart = pos + 5
      val keyEnd = keyStart + view.getInt(pos + 1)
      val recordEnd = if (isPut(data(pos))) keyEnd + 4 + view.getInt(keyEnd) else keyEnd
      System.arraycopy(data, keyStart, groups, g, 4)
      g += 4
      System.arraycopy(data, pos, rest, out, 5)
      System.arraycopy(data, keyStart + 4, rest, out + 5, recordEnd - keyStart - 4)
      out += recordEnd - pos - 4
      pos = recordEnd
    }
    System.arraycopy(data, end, rest, out, TrailerBytes)
    (groups, rest, out + TrailerBytes)
  }

  /** The inverse of [[splitKeyGroups]]; every length is checked, the format-1 read checks the rest. */
  def joinKeyGroups(groups: Array[Byte], rest: Array[Byte], source: String): Array[Byte] = {
    def corrupt = new CorruptChangelogException(s"$source is corrupt (key groups and records disagree)")
    if (rest.length < HeaderBytes + TrailerBytes) throw corrupt
    val out = new Array[Byte](rest.length + groups.length)
    System.arraycopy(rest, 0, out, 0, HeaderBytes)
    val view = ByteBuffer.wrap(rest)
    val end = rest.length - TrailerBytes
    var pos = HeaderBytes
    var o = HeaderBytes
    var g = 0
    while (pos < end) {
      if (pos + 5 > end) throw corrupt
      val keyLength = view.getInt(pos + 1)
      val keyRestEnd = pos + 5L + keyLength - 4
      if (keyLength < 4 || g + 4 > groups.length || keyRestEnd > end) throw corrupt
      val recordEnd =
        if (isPut(rest(pos))) {
          if (keyRestEnd + 4 > end) throw corrupt
          keyRestEnd + 4 + view.getInt(keyRestEnd.toInt)
        } else keyRestEnd
      if (recordEnd > end || recordEnd < keyRestEnd) throw corrupt
      System.arraycopy(rest, pos, out, o, 5)
      System.arraycopy(groups, g, out, o + 5, 4)
      System.arraycopy(rest, pos + 5, out, o + 9, (recordEnd - pos - 5).toInt)
      o += (recordEnd - pos).toInt + 4
      g += 4
      pos = recordEnd.toInt
    }
    if (g != groups.length) throw corrupt
    System.arraycopy(rest, end, out, o, TrailerBytes)
    out
  }

  def unzstd(data: Array[Byte], offset: Int, length: Int, source: String): Array[Byte] = {
    val size = Zstd.getFrameContentSize(data, offset, length)
    if (size < 0 || size > MaxBytes) throw new CorruptChangelogException(s"$source is corrupt (its zstd frame states $size bytes)")
    val out = new Array[Byte](size.toInt)
    val n = Zstd.decompressByteArray(out, 0, out.length, data, offset, length)
    if (Zstd.isError(n) || n != size) {
      throw new CorruptChangelogException(s"$source is truncated or corrupt (zstd: ${if (Zstd.isError(n)) Zstd.getErrorName(n) else s"$n of $size bytes"})")
    }
    out
  }
}
