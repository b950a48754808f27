package io.keyedstate.format

import java.nio.ByteBuffer

import io.keyedstate.format.ChangelogFormat.{HeaderBytes, Record, TrailerBytes, isDelete, isPut}

/** Every record of the format-1 changelog `data` in order; fails naming `source` on any length,
 *  op or count that does not fit (a CRC proves the bytes are the writer's, not that they parse). */
private[format] final class ChangelogRecords(data: Array[Byte], recordCount: Long, source: String)
    extends Iterator[Record] {
  private val b = ByteBuffer.wrap(data, HeaderBytes, data.length - HeaderBytes - TrailerBytes).slice()
  private var count = 0L

  override def hasNext: Boolean = b.hasRemaining || {
    if (count != recordCount) {
      throw new CorruptChangelogException(s"$source holds $count records but its trailer says $recordCount: corrupt")
    }
    false
  }

  override def next(): Record = {
    if (!hasNext) throw new NoSuchElementException
    val op = b.get()
    val key = bytes(int("key length"), "key")
    val record =
      if (isPut(op)) Record(op, key, bytes(int("value length"), "value"))
      else if (isDelete(op)) Record(op, key, null)
      else throw new CorruptChangelogException(s"$source: unknown record op $op in record $count")
    count += 1
    record
  }

  private def bytes(n: Int, what: String): Array[Byte] = {
    if (n < 0 || n > b.remaining()) {
      throw new CorruptChangelogException(s"$source: record $count ($what of $n bytes) overruns the file")
    }
    val out = new Array[Byte](n)
    b.get(out)
    out
  }

  private def int(what: String): Int = {
    if (b.remaining() < 4) throw new CorruptChangelogException(s"$source: record $count ($what) overruns the file")
    b.getInt()
  }
}
