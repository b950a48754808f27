package io.keyedstate.engine

import io.keyedstate.format.ScanChunk

/**
 * Reads of the committed version a [[StoreEngine]] holds. Three layers with this one interface,
 * each with one concern, composed by the engine: [[CachedReads]] (the near cache) over
 * [[NativeReads]] (RocksDB's files, read in the JVM) over [[ServerReads]] (round trips to the
 * state server, when native reads are off or unavailable).
 */
trait CommittedReads {
  /** The stored value, or null when the key is absent. */
  def get(key: Bytes): Array[Byte]
  /** [[get]] for many keys at once (null where absent). */
  def getMany(keys: Array[Bytes]): Array[Array[Byte]]
  /** About a chunk of entries with `prefix` after `startAfter` (null: from the start). */
  def scan(prefix: Array[Byte], startAfter: Array[Byte], keysOnly: Boolean): ScanChunk
}
