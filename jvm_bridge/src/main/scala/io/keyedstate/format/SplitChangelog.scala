package io.keyedstate.format

import java.io.OutputStream
import java.nio.ByteBuffer

import io.keyedstate.format.ChangelogFormat.{End, HeaderBytes, MaxBytes, TrailerBytes, isPut}

/**
 * A format-1 changelog held the way changelog codec 2 splits it (spec: FORMATS.md,
 * "Changelog"): its key groups, the first 4 bytes of every record's key in record order, and
 * the rest, the changelog with those 4 bytes cut out of every key.
 *
 * A version's writes are split as they are encoded ([[Splitter]]), so that a commit compresses
 * the two parts where they lie and ships the format-1 bytes to the state server by joining them
 * a chunk at a time ([[writeFormat1]]): a commit holds the changelog once, split, never beside
 * a joined copy or a compressBound-sized file buffer (each a G1 humongous array).
 */
final class SplitChangelog private[format] (groups: Array[Byte], groupsLength: Int, rest: Array[Byte], restLength: Int) {
  require(groupsLength % 4 == 0 && restLength >= HeaderBytes + TrailerBytes, "a split changelog needs a header and a trailer")

  /** Bytes of the format-1 changelog. */
  def length: Long = groupsLength.toLong + restLength
  def recordCount: Long = groupsLength / 4
  /** The version and key-group count of its header. */
  def version: Long = ByteBuffer.wrap(rest, 10, 8).getLong()
  def keyGroups: Int = ByteBuffer.wrap(rest, 18, 4).getInt()

  private[format] def groupBytes: (Array[Byte], Int) = (groups, groupsLength)
  private[format] def restBytes: (Array[Byte], Int) = (rest, restLength)

  /**
   * Writes the format-1 changelog into `chunk` (a heap buffer) and hands it to `flush` whenever
   * it is full and once at the end (flipped; `flush` must consume it, the chunk is reused).
   */
  def writeFormat1(chunk: ByteBuffer, flush: ByteBuffer => Unit): Unit = {
    require(chunk.hasArray && chunk.capacity() > 0, "a chunk needs a heap array")
    new Join(chunk, flush, pos => new IllegalStateException(s"keyedstate: a split changelog is inconsistent at byte $pos")).run()
  }

  /** The format-1 changelog into `out` (exactly [[length]] bytes) for a loaded file: its parts
   *  are untrusted, every length is checked against them, and a misfit is `corrupt`. */
  private[format] def joinInto(out: Array[Byte], corrupt: => Exception): Unit = {
    require(out.length == length, "the join's array must fit the changelog")
    new Join(ByteBuffer.wrap(out), _ => (), _ => corrupt).run()
  }

  /** The join's state in fields, not in locals captured by closures (which Scala boxes): a
   *  record that fits the chunk is copied with two array copies and four byte stores. Lengths
   *  are read as longs, so that no length a tampered file states can wrap around. */
  private final class Join(chunk: ByteBuffer, flush: ByteBuffer => Unit, misfit: Int => Exception) {
    private val buf = chunk.array()
    private val base = chunk.arrayOffset()
    private val capacity = chunk.capacity()
    private var at = 0

    def run(): Unit = {
      val end = restLength - TrailerBytes
      emit(rest, 0, HeaderBytes)
      var pos = HeaderBytes
      var g = 0
      while (pos < end) {
        if (pos + 5 > end) throw misfit(pos)
        val keyRest = pos + 1L + int(rest, pos + 1) // the key's bytes after its group start here
        if (keyRest < pos + 5 || keyRest > end || g + 4 > groupsLength) throw misfit(pos)
        val recordEnd =
          if (isPut(rest(pos))) {
            if (keyRest + 4 > end) throw misfit(pos)
            val valueLength = int(rest, keyRest.toInt)
            if (valueLength < 0) throw misfit(pos)
            keyRest + 4 + valueLength
          } else keyRest
        if (recordEnd > end) throw misfit(pos)
        val after = (recordEnd - pos - 5).toInt
        if (capacity - at >= after + 9) {
          val o = base + at
          System.arraycopy(rest, pos, buf, o, 5)
          buf(o + 5) = groups(g); buf(o + 6) = groups(g + 1); buf(o + 7) = groups(g + 2); buf(o + 8) = groups(g + 3)
          System.arraycopy(rest, pos + 5, buf, o + 9, after)
          at += after + 9
        } else {
          emit(rest, pos, 5)
          emit(groups, g, 4)
          emit(rest, pos + 5, after)
        }
        g += 4
        pos = recordEnd.toInt
      }
      if (g != groupsLength) throw misfit(pos)
      emit(rest, end, TrailerBytes)
      if (at > 0) flushChunk()
      chunk.clear()
    }

    private def int(a: Array[Byte], i: Int): Int =
      ((a(i) & 0xFF) << 24) | ((a(i + 1) & 0xFF) << 16) | ((a(i + 2) & 0xFF) << 8) | (a(i + 3) & 0xFF)

    private def emit(a: Array[Byte], offset: Int, length: Int): Unit = {
      var off = offset
      var left = length
      while (left > 0) {
        val n = math.min(left, capacity - at)
        System.arraycopy(a, off, buf, base + at, n)
        at += n
        off += n
        left -= n
        if (at == capacity) flushChunk()
      }
    }

    private def flushChunk(): Unit = { chunk.clear(); chunk.limit(at); flush(chunk); at = 0 }
  }

  /** The format-1 changelog in one array (tests and tools; a commit never builds it). */
  def format1: ByteBuffer = {
    require(length <= MaxBytes, s"a changelog of $length bytes")
    val out = ByteBuffer.allocate(length.toInt)
    writeFormat1(ByteBuffer.allocate(1 << 16), c => out.put(c))
    out.flip()
    out
  }
}

object SplitChangelog {
  /** Codec 2's split of a format-1 changelog (its framing is the caller's to have checked). */
  def of(format1: ByteBuffer): SplitChangelog = {
    val b = format1.duplicate()
    val splitter = new Splitter(b.remaining().toLong, 0)
    splitter.write(b.array(), b.arrayOffset() + b.position(), b.remaining())
    splitter.finish()
  }

  /**
   * An [[OutputStream]] that takes a format-1 changelog's bytes in any pieces (what
   * [[ChangelogFormat.Writer]] passes on) and keeps them split: key groups apart, the rest
   * together. A record's fields may straddle pieces; the stream remembers where it is. Starts
   * with room for `expectedBytes` of changelog with `expectedRecords` records, so that a
   * changelog as large as the last one is not copied while it grows.
   */
  final class Splitter(expectedBytes: Long, expectedRecords: Long) extends OutputStream {
    private val groups = new Growing(math.min(4L * expectedRecords, MaxBytes).toInt.max(256))
    private val rest = new Growing(math.min(expectedBytes - 4L * expectedRecords, MaxBytes).toInt.max(1 << 12))
    private var phase = Header
    private var need = HeaderBytes // bytes left in the field being read
    private var number = 0 // a length field as its bytes arrive
    private var op: Byte = 0
    private var keyLength = 0

    override def write(b: Int): Unit = write(Array(b.toByte), 0, 1)

    /** Reads the fields' lengths as they pass; copies a record's rest bytes in one run and its
     *  key group apart. */
    override def write(b: Array[Byte], offset: Int, length: Int): Unit = {
      if (phase == Done && length > 0) throw new IllegalStateException("keyedstate: bytes after a changelog's trailer")
      if (groups.size.toLong + rest.size + length > MaxBytes) {
        throw new IllegalStateException(s"keyedstate: a version writes more than $MaxBytes changelog bytes; " +
          "at most 2 GB per commit")
      }
      var off = offset
      val end = offset + length
      var runFrom = off // rest bytes from here to off are not copied yet
      while (off < end) {
        if (phase == Group) {
          if (off > runFrom) rest.append(b, runFrom, off - runFrom)
          val n = math.min(need, end - off)
          groups.append(b, off, n)
          off += n
          need -= n
          runFrom = off
        } else if (phase == KeyLength || phase == ValueLength) {
          if (need == 4 && end - off >= 4) { // the common case: all four bytes here
            number = ((b(off) & 0xFF) << 24) | ((b(off + 1) & 0xFF) << 16) | ((b(off + 2) & 0xFF) << 8) | (b(off + 3) & 0xFF)
            off += 4
            need = 0
          } else {
            number = (number << 8) | (b(off) & 0xFF)
            off += 1
            need -= 1
          }
        } else if (phase == Op) {
          op = b(off)
          off += 1
          need = 0
        } else if (phase == Done) {
          throw new IllegalStateException("keyedstate: bytes after a changelog's trailer")
        } else { // Header, KeyRest, Value, Trailer: rest bytes, passed over
          val n = math.min(need, end - off)
          off += n
          need -= n
        }
        if (need == 0) advance()
      }
      if (end > runFrom) rest.append(b, runFrom, end - runFrom)
    }

    /** The field just read is complete: on to the next. */
    private def advance(): Unit = phase match {
      case Header | Value => phase = Op; need = 1
      case Op =>
        if (op == End) { phase = Trailer; need = TrailerBytes - 1 }
        else { phase = KeyLength; need = 4; number = 0 }
      case KeyLength =>
        keyLength = number
        if (keyLength < 4) {
          throw new IllegalStateException(s"keyedstate: a changelog key of $keyLength bytes has no key group")
        }
        phase = Group; need = 4
      case Group =>
        phase = KeyRest; need = keyLength - 4
        if (need == 0) advance()
      case KeyRest =>
        if (isPut(op)) { phase = ValueLength; need = 4; number = 0 } else { phase = Op; need = 1 }
      case ValueLength =>
        if (number < 0) throw new IllegalStateException(s"keyedstate: a changelog value of $number bytes")
        phase = Value; need = number
        if (need == 0) advance()
      case Trailer => phase = Done; need = -1
    }

    /** The split changelog, once its trailer has been written. */
    def finish(): SplitChangelog = {
      if (phase != Done) throw new IllegalStateException("keyedstate: a split changelog is incomplete (no trailer)")
      new SplitChangelog(groups.array, groups.size, rest.array, rest.size)
    }
  }

  private final val Header = 0
  private final val Op = 1
  private final val KeyLength = 2
  private final val Group = 3
  private final val KeyRest = 4
  private final val ValueLength = 5
  private final val Value = 6
  private final val Trailer = 7
  private final val Done = 8

  /** A byte array that grows (by doubling; not synchronized, unlike ByteArrayOutputStream), whose
   *  array is handed out without a copy. Its callers cap the total at [[MaxBytes]]. */
  private final class Growing(initial: Int) {
    var array: Array[Byte] = new Array[Byte](initial)
    var size = 0

    def append(b: Array[Byte], off: Int, len: Int): Unit = {
      if (size + len > array.length) {
        array = java.util.Arrays.copyOf(array, math.min(math.max(array.length.toLong * 2, size.toLong + len), MaxBytes).toInt)
      }
      System.arraycopy(b, off, array, size, len)
      size += len
    }
  }
}
