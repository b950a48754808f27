package io.keyedstate.engine

import java.util.concurrent.atomic.AtomicLong

import io.keyedstate.format.{ChangelogFormat, ScanChunk}

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

/** Round trips to the state server over the data channel. */
final class ServerReads(session: ServerSession, chunkBytes: () => Int, describe: String) extends CommittedReads {
  override def get(key: Bytes): Array[Byte] = session.data(s"reading $describe")((c, h) => c.get(h, key.bytes))
  override def getMany(keys: Array[Bytes]): Array[Array[Byte]] =
    session.data(s"reading $describe")((c, h) => c.multiGet(h, keys.map(_.bytes)))
  override def scan(prefix: Array[Byte], startAfter: Array[Byte], keysOnly: Boolean): ScanChunk =
    session.data(s"scanning $describe")((c, h) => c.scan(h, prefix, startAfter, chunkBytes(), keysOnly))
}

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

/**
 * The near cache over `inner`: a hit or a known absence costs no call; a miss reads `inner`,
 * caches the value and reports itself (`onMisses`: the engine may then scan the version in).
 * One instance per store version: `learned` records what misses found out about keys'
 * existence (key -> existed), so that each write can be logged as new or existing even after
 * the LRU evicted the key, and the changelog applied behind without a read.
 *
 * The version's writes go into the cache as they happen ([[write]]): the commit then has no
 * per-key work left. Until the version commits the cache is ahead of the committed state, so a
 * version that does not commit must be invalidated by the engine (an abort reloads).
 */
final class CachedReads(cache: NearCache, inner: CommittedReads, onMisses: Int => Unit = _ => ()) extends CommittedReads {
  val learned = new java.util.HashMap[Bytes, java.lang.Boolean]()

  /** Takes a write (value, or [[WriteBuffer.Tombstone]]) into the cache; returns its changelog
   *  op: what was known of the key just before it (0: a delete of a key known to be absent). */
  def write(key: Bytes, value: Array[Byte]): Byte =
    ChangelogFormat.settle(cache.commitWrite(key, value), learned.get(key))

  override def get(key: Bytes): Array[Byte] = {
    val cached = cache.lookup(key)
    if (cached eq NearCache.Absent) null
    else if (cached != null) cached
    else {
      val value = inner.get(key)
      if (value != null) cache.putRead(key, value)
      learned.put(key, value != null)
      onMisses(1) // last: it may refill the cache
      value
    }
  }

  override def getMany(keys: Array[Bytes]): Array[Array[Byte]] = {
    val out = new Array[Array[Byte]](keys.length)
    val missing = scala.collection.mutable.ArrayBuffer.empty[Int]
    var i = 0
    while (i < keys.length) {
      val cached = cache.lookup(keys(i))
      if (cached eq NearCache.Absent) out(i) = null
      else if (cached != null) out(i) = cached
      else missing += i
      i += 1
    }
    if (missing.nonEmpty) {
      val values = inner.getMany(missing.map(keys(_)).toArray)
      missing.indices.foreach { j =>
        val k = keys(missing(j))
        out(missing(j)) = values(j)
        if (values(j) != null) cache.putRead(k, values(j))
        learned.put(k, values(j) != null)
      }
      onMisses(missing.length)
    }
    out
  }

  override def scan(prefix: Array[Byte], startAfter: Array[Byte], keysOnly: Boolean): ScanChunk =
    inner.scan(prefix, startAfter, keysOnly)

  /** The cache's committed entries, when it holds every key of the version (else None). */
  def completeSnapshot(): Option[Array[(Array[Byte], Array[Byte])]] =
    if (cache.complete) Some(cache.snapshot()) else None
}
