package io.keyedstate.engine

/**
 * Fills the near cache with the committed version by one sequential scan, so that later reads
 * are local. A point read of a
 * key the cache lacks costs about as much as scanning [[ScanKeysPerRead]] keys, so the engine
 * scans a small version in at load, and a large one only once its point reads have cost about
 * what the scan would ([[StoreEngine]]): a batch that touches a few keys of a large state (the
 * first one after a restart or a rescale) then never pays for the whole state.
 */
object CacheWarmer {
  /** A native point read of a key over a key's share of a scan into the cache, as measured with
   *  Spark's rocksdbjni by benchmarks/read_cost.py (benchmarks/RESULTS-warm.md). */
  val ScanKeysPerRead = 5

  /**
   * [[warm]] while version `writes` is open: the cache holds that version's writes too (each
   * write goes into it as it happens), so they are taken into the freshly scanned cache again.
   */
  def warmUnder(cache: NearCache, reads: CommittedReads, numKeys: Long, writes: Option[WriteBuffer]): Unit = {
    warm(cache, reads, numKeys)
    writes.foreach(_.foreachWrite { (key, value) =>
      if (value eq WriteBuffer.Tombstone) cache.remove(key) else cache.put(key, value)
    })
  }

  /**
   * Streams the loaded version into the cache: values while the budget lasts (the cache stays
   * complete if they all fit), then keys only, into the Bloom filter the cache started when it
   * went partial.
   */
  def warm(cache: NearCache, reads: CommittedReads, numKeys: Long): Unit = {
    cache.clear()
    cache.complete = true // provisional: every key seen so far is cached
    var after: Array[Byte] = null
    var more = true
    while (more && cache.complete) {
      val chunk = reads.scan(Array.emptyByteArray, after, keysOnly = false)
      var i = 0
      while (i < chunk.keys.length) { cache.put(new Bytes(chunk.keys(i)), chunk.values(i)); i += 1 }
      more = chunk.hasMore
      if (chunk.keys.nonEmpty) after = chunk.keys.last
    }
    if (more) forKeys(reads, after)(key => cache.addToBloom(Bytes.hashOf(key)))
  }

  /** Rebuilds the Bloom filter over every key (it grew too large or too full): the new filter
   *  replaces the old one only once the scan is through. */
  def indexKeys(cache: NearCache, reads: CommittedReads, numKeys: Long): Unit =
    cache.rebuildBloom(numKeys)(forKeys(reads, null))

  private def forKeys(reads: CommittedReads, startAfter: Array[Byte])(f: Array[Byte] => Unit): Unit = {
    var after = startAfter
    var more = true
    while (more) {
      val chunk = reads.scan(Array.emptyByteArray, after, keysOnly = true)
      chunk.keys.foreach(f)
      more = chunk.hasMore
      if (chunk.keys.nonEmpty) after = chunk.keys.last
    }
  }
}
