package io.keyedstate.engine

import java.util.concurrent.atomic.AtomicLong

import io.keyedstate.format.ScanChunk

/**
 * RocksDB's files read in the JVM (a secondary instance, [[NativeReader]]). `ready` makes the
 * reader show the engine's version (one sync with the server per version) and returns it, or
 * null when native reads are off or unavailable: then `fallback` answers.
 */
final class NativeReads(ready: () => NativeReader, fallback: CommittedReads, chunkBytes: () => Int,
    val gets: AtomicLong) extends CommittedReads {
  override def get(key: Bytes): Array[Byte] = {
    val reader = ready()
    if (reader == null) fallback.get(key) else { gets.incrementAndGet(); reader.get(key.bytes) }
  }
  override def getMany(keys: Array[Bytes]): Array[Array[Byte]] = {
    val reader = ready()
    if (reader == null) fallback.getMany(keys)
    else { gets.addAndGet(keys.length); keys.map(k => reader.get(k.bytes)) }
  }
  override def scan(prefix: Array[Byte], startAfter: Array[Byte], keysOnly: Boolean): ScanChunk = {
    val reader = ready()
    if (reader == null) fallback.scan(prefix, startAfter, keysOnly)
    else reader.scan(prefix, startAfter, chunkBytes(), keysOnly)
  }
}
