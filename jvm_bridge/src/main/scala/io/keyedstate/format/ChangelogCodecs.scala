package io.keyedstate.format

import java.io.{ByteArrayInputStream, IOException}

import com.github.luben.zstd.{Zstd, ZstdException, ZstdInputStreamNoFinalizer}

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

  /** At most this many output bytes per input byte are allocated before they are decompressed
   *  (FORMATS.md, "Changelog": a frame's content size is a claim, checked as the bytes come). */
  val UpfrontRatio = 64
  private val UpfrontSlack = 1 << 16

  /**
   * One zstd frame, decompressed: exactly the content size its header states (at most
   * [[MaxBytes]]), else [[CorruptChangelogException]] naming `source`. A claim beyond
   * [[UpfrontRatio]] times the frame's size is not allocated: the output grows from there as
   * bytes come out of the stream, so that a header claiming more than the frame holds costs no
   * more than the frame could fill.
   */
  def unzstd(data: Array[Byte], offset: Int, length: Int, source: String): Array[Byte] = {
    def corrupt(why: String) = new CorruptChangelogException(s"$source is truncated or corrupt (zstd: $why)")
    if (length <= 0) throw corrupt("no frame")
    val size = try Zstd.getFrameContentSize(data, offset, length) catch {
      case e: ZstdException => throw corrupt(e.getMessage)
    }
    if (size < 0 || size > MaxBytes) throw new CorruptChangelogException(s"$source is corrupt (its zstd frame states $size bytes)")
    val upfront = math.min(size, UpfrontRatio.toLong * length + UpfrontSlack).toInt
    val (out, n) = try {
      if (upfront == size) { // within the bound: one call into the exact size, the fastest way
        val out = new Array[Byte](upfront)
        val n = Zstd.decompressByteArray(out, 0, out.length, data, offset, length)
        if (Zstd.isError(n)) throw corrupt(Zstd.getErrorName(n))
        (out, n)
      } else streamed(data, offset, length, size, upfront, corrupt)
    } catch {
      case e: IOException => throw corrupt(e.getMessage)
      case e: ZstdException => throw corrupt(e.getMessage)
    }
    if (n != size) throw corrupt(s"$n of $size bytes")
    out
  }

  /** [[unzstd]] beyond the bound: the output starts at `upfront` bytes and doubles as the stream
   *  fills it, up to `size`; (output, bytes decompressed). */
  private def streamed(data: Array[Byte], offset: Int, length: Int, size: Long, upfront: Int,
      corrupt: String => CorruptChangelogException): (Array[Byte], Long) = {
    var out = new Array[Byte](upfront)
    var n = 0
    val in = new ZstdInputStreamNoFinalizer(new ByteArrayInputStream(data, offset, length))
    try {
      var more = true
      while (more) {
        if (n == out.length && n < size) out = java.util.Arrays.copyOf(out, math.min(size, 2L * n).toInt)
        val got = if (n < out.length) in.read(out, n, out.length - n) else if (in.read() < 0) -1 else 1
        if (got < 0) more = false
        else if (n == size) throw corrupt(s"more than the $size bytes its frame states")
        else n += got
      }
    } finally in.close()
    (out, n)
  }
}
