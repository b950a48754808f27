package io.keyedstate.format

import com.github.luben.zstd.{Zstd, ZstdException}

import io.keyedstate.format.ChangelogFormat.{HeaderBytes, MaxBytes, TrailerBytes, ZstdLevel}

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

  /** Codec 2's join of a loaded changelog's key groups and the rest (the commit's join,
   *  [[SplitChangelog]]'s, with every length checked); the format-1 read checks the rest. */
  def joinKeyGroups(groups: Array[Byte], rest: Array[Byte], source: String): Array[Byte] = {
    def corrupt = new CorruptChangelogException(s"$source is corrupt (key groups and records disagree)")
    if (rest.length < HeaderBytes + TrailerBytes || groups.length % 4 != 0 ||
        rest.length.toLong + groups.length > MaxBytes) throw corrupt
    val out = new Array[Byte](rest.length + groups.length)
    new SplitChangelog(groups, groups.length, rest, rest.length).joinInto(out, corrupt)
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
