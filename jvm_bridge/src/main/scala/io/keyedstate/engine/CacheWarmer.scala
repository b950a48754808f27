package io.keyedstate.engine

/**
 * Fills the near cache with the committed version by one sequential scan, so that later reads
 * are local. The engine scans a small version in at load, and a large one only once its cold
 * point reads have cost, in time measured, what the scan would, or one version's cold reads
 * say the next [[ScanHorizonVersions]] would ([[StoreEngine]]): a batch that touches a few keys
 * of a large state (the first one after a restart or a rescale) then never pays for the whole
 * state, and a query that keeps reading widely is warm from its second or third version.
 */
object CacheWarmer {
  /** A point read through the state server (not timed: no native reader) over a key's share of
   *  a scan into the cache, as measured with Spark's rocksdbjni by benchmarks/read_cost.py
   *  (benchmarks/RESULTS-warm.md); native reads are timed instead. */
  val ScanKeysPerRead = 5

  /** What scanning a key into the cache costs before this executor measured it (ns; with the
   *  cache's insert, benchmarks/RESULTS-warm.md), and the least scan that measures it. */
  val DefaultScanNanosPerKey = 1300L
  private val MeasuredFromKeys = 10000L
  @volatile private var scanNanos = DefaultScanNanosPerKey

  /** The cost of scanning one key into the cache, as the last large warm-up measured it. */
  def scanNanosPerKey: Long = scanNanos

  /** At most this many scanned keys' cost is charged for one timed read: beyond it, the time
   *  was a pause (a collection, the thread descheduled), not the read. */
  val MaxScanKeysPerRead = 64

  /**
   * What `n` cold reads cost, in ns, against a scan: native reads as timed (`timedNanos`), each
   * between one scanned key (a read seeks, then reads a key) and [[MaxScanKeysPerRead]]; reads
   * through the state server (not timed: 0) at [[ScanKeysPerRead]] keys each.
   */
  def readCost(n: Int, timedNanos: Long): Long = {
    val key = scanNanos
    if (timedNanos <= 0) n.toLong * ScanKeysPerRead * key
    else math.min(math.max(timedNanos, n.toLong * key), n.toLong * MaxScanKeysPerRead * key)
  }

  /** A streaming query's next versions read much as its last did: once one version's cold
   *  reads, repeated for this many versions, cost what is left of the scan's price, the scan
   *  comes at the next version's first miss instead of after them. So it comes this many
   *  versions' reads early at most, and a query that stops right after it paid no more than
   *  that for a scan it no longer needed. */
  val ScanHorizonVersions = 10

  /** Whether a cold version's scan is due now, its last version's cold reads having cost
   *  `versionNanos` and `leftNanos` being what is left of the scan's price. */
  def scanDueAfter(versionNanos: Long, leftNanos: Long): Boolean =
    versionNanos > 0 && versionNanos >= leftNanos / ScanHorizonVersions

  private def measured(keys: Long, nanos: Long): Unit =
    if (keys >= MeasuredFromKeys) scanNanos = math.max(1L, nanos / keys)

  /**
   * [[warm]] while version `writes` is open: the cache holds that version's writes too (each
   * write goes into it as it happens), so they are taken into the freshly scanned cache again.
   */
  def warmUnder(cache: NearCache, reads: CommittedReads, numKeys: Long, writes: Option[WriteBuffer]): Unit = {
    val started = System.nanoTime()
    measured(warm(cache, reads, numKeys), System.nanoTime() - started)
    writes.foreach(_.foreachWrite { (key, value) =>
      if (value eq WriteBuffer.Tombstone) cache.remove(key) else cache.put(key, value)
    })
  }

  /**
   * Streams the loaded version into the cache: values while the budget lasts (the cache stays
   * complete if they all fit), then keys only, into the Bloom filter the cache started when it
   * went partial. Returns the keys scanned.
   */
  def warm(cache: NearCache, reads: CommittedReads, numKeys: Long): Long = {
    cache.clear()
    cache.complete = true // provisional: every key seen so far is cached
    var after: Array[Byte] = null
    var more = true
    var scanned = 0L
    while (more && cache.complete) {
      val chunk = reads.scan(Array.emptyByteArray, after, keysOnly = false)
      var i = 0
      while (i < chunk.keys.length) { cache.put(new Bytes(chunk.keys(i)), chunk.values(i)); i += 1 }
      scanned += chunk.keys.length
      more = chunk.hasMore
      if (chunk.keys.nonEmpty) after = chunk.keys.last
    }
    if (more) forKeys(reads, after) { key => cache.addToBloom(Bytes.hashOf(key)); scanned += 1 }
    scanned
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
