package io.keyedstate.format

import java.nio.ByteBuffer

import com.github.luben.zstd.{Zstd, ZstdException}

import io.keyedstate.format.ChangelogFormat.{isPut, HeaderBytes, MaxBytes, TrailerBytes, ZstdLevel}

/**
 * The body codecs of changelog format 2 (spec: FORMATS.md, "Changelog"): zstd frames with their
 * content size, and the join of codec 2's key groups and the rest ([[SplitChangelog]] owns the
 * split). Kept apart from [[ChangelogFormat]], which owns the framing, the header and the
 * record reader.
 */
private[format] object ChangelogCodecs {
  /** Compresses `src[offset, offset + length)` into `dst` at `at` (room for compressBound); the bytes written. */
  def zstdInto(dst: Array[Byte], at: Int, src: Array[Byte], offset: Int, length: Int): Int = {
    val n = Zstd.compressByteArray(dst, at, dst.length - at, src, offset, length, ZstdLevel)
    if (Zstd.isError(n)) throw new IllegalStateException(s"keyedstate: zstd failed: ${Zstd.getErrorName(n)}")
    n.toInt
  }

  /** [[zstdInto]], or -1 when `dst` lacks room from `at` on (a buffer smaller than compressBound). */
  def zstdIntoIfRoom(dst: Array[Byte], at: Int, src: Array[Byte], offset: Int, length: Int): Int =
    if (at > dst.length) -1
    else try zstdInto(dst, at, src, offset, length) catch {
      // zstd-jni throws its errors (the code is zstd's error enum), it does not return them
      case e: ZstdException if e.getErrorCode == Zstd.errDstSizeTooSmall() => -1
    }

  /** Codec 2's join of a changelog's key groups and the rest ([[SplitChangelog]] splits); every length is checked, the format-1 read checks the rest. */
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
