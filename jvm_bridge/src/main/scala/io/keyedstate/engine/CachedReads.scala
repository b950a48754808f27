package io.keyedstate.engine

import io.keyedstate.format.{ChangelogFormat, ScanChunk}

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
