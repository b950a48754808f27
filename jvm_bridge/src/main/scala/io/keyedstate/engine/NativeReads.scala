package io.keyedstate.engine

import java.util.concurrent.atomic.AtomicLong

import io.keyedstate.format.ScanChunk

/**
 * RocksDB's files read in the JVM (a secondary instance, [[NativeReader]]) at the engine's
 * version (`version`): a point read takes the writes committed since the reader's version from
 * [[NativeSync]]'s overlay first; a scan has the reader show the version itself. When native
 * reads are off or unavailable, `fallback` answers.
 */
private[engine] final class NativeReads(sync: NativeSync, version: () => Long, fallback: CommittedReads,
    chunkBytes: () => Int, val gets: AtomicLong) extends CommittedReads {
  private val readNanos = new AtomicLong

  /** Time spent in point reads of the reader (not in catching up) since last taken; 0 when
   *  reads went to the server. */
  def takeReadNanos(): Long = readNanos.getAndSet(0)

  override def get(key: Bytes): Array[Byte] = {
    val reader = sync.forGets(version())
    if (reader == null) fallback.get(key)
    else {
      gets.incrementAndGet()
      val started = System.nanoTime()
      try read(reader, key) finally readNanos.addAndGet(System.nanoTime() - started)
    }
  }
  override def getMany(keys: Array[Bytes]): Array[Array[Byte]] = {
    val reader = sync.forGets(version())
    if (reader == null) fallback.getMany(keys)
    else {
      gets.addAndGet(keys.length)
      val started = System.nanoTime()
      try keys.map(read(reader, _)) finally readNanos.addAndGet(System.nanoTime() - started)
    }
  }
  /** Has the reader show the version itself now (the catch-up a scan needs), so that timing
   *  the scan leaves the catch-up out. */
  def prepareScan(): Unit = sync.forScans(version())

  override def scan(prefix: Array[Byte], startAfter: Array[Byte], keysOnly: Boolean): ScanChunk = {
    val reader = sync.forScans(version())
    if (reader == null) fallback.scan(prefix, startAfter, keysOnly)
    else reader.scan(prefix, startAfter, chunkBytes(), keysOnly)
  }

  private def read(reader: NativeReader, key: Bytes): Array[Byte] = {
    val written = sync.overlaidValue(key)
    if (written == null) reader.get(key.bytes)
    else if (written eq WriteBuffer.Tombstone) null
    else written
  }
}
