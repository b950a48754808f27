package io.keyedstate.engine

/** Fills the near cache right after a load, so that the first batch reads locally. */
object CacheWarmer {
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
    if (more) addKeys(cache, reads, after)
  }

  /** Rebuilds the Bloom filter over every key (it held more keys than it was sized for). */
  def indexKeys(cache: NearCache, reads: CommittedReads, numKeys: Long): Unit = {
    cache.startBloom(cache.bloomCapacityFor(numKeys))
    cache.complete = false
    addKeys(cache, reads, null)
  }

  private def addKeys(cache: NearCache, reads: CommittedReads, startAfter: Array[Byte]): Unit = {
    var after = startAfter
    var more = true
    while (more) {
      val chunk = reads.scan(Array.emptyByteArray, after, keysOnly = true)
      chunk.keys.foreach(cache.addToBloom)
      more = chunk.hasMore
      if (chunk.keys.nonEmpty) after = chunk.keys.last
    }
  }
}
