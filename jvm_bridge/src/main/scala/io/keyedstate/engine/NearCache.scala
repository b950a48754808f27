package io.keyedstate.engine

import io.keyedstate.format.ChangelogFormat

/**
 * Committed state of one store partition, cached on the JVM heap so that the operators' per-row
 * reads (one synchronous get/keyExists per row, ~1-3 us in Spark's own RocksDB provider) cost a
 * hash lookup; a miss is a native read of RocksDB's files ([[NativeReads]], ~15 us).
 *
 * Valid for exactly the version its [[StoreEngine]] holds: the engine updates it with each commit
 * and clears it whenever it loads another version or loses track of the one it holds, so it
 * never serves stale data.
 * `complete` = every key of the version is here, so a miss means absent. Once the shared
 * budget forces evictions, a Bloom filter over every key keeps answering "absent" without a
 * read for most new keys (dedup, first-seen keys). Entries live in a [[BytesMap]] (pages, not
 * objects: what the budget counts is what the heap holds); eviction drops the oldest page and
 * gives keys read since they were written a second chance. Single-threaded: only the task
 * thread that owns the partition touches it.
 *
 * Admission: a key the cache lacks enters it when read, and when written while the store's
 * reads find what they look for. A store whose committed version's reads almost never found a
 * key (dedup: every read asks for a key never seen) would otherwise fill the budget with keys
 * nobody reads again; [[review]] then stops admitting written keys and drops the entries, and a
 * Bloom filter keeps answering "absent" ([[ReReadsToStop]], [[ReReadsToResume]]).
 */
final class NearCache(fpp: Double) {
  import NearCache._

  private val bitsPerKey = KeyFilter.bitsPerKey(fpp) // what a key takes in a filter at `fpp`

  private val entries = new BytesMap(() => pageSize())
  private var charged = 0L // bytes of `entries` counted in CacheBudget
  private var bloom: KeyFilter = _
  // The key a lookup just answered absent from the filter: the write that usually follows it
  // (dedup: read, then insert) need not ask the filter again.
  private var lastAbsent: Bytes = _
  var complete = false

  // Counters since the last metrics report.
  private var hits = 0L
  private var absentAnswers = 0L
  private var misses = 0L
  private var evictions = 0L

  // Since the last [[review]]: lookups, and those that found a key (a hit or a found miss).
  private var lookups = 0L
  private var reReads = 0L
  private var admitWrites = true

  /** The counters since the last call, then zero. */
  def takeCounters(): CacheCounters = {
    val c = CacheCounters(hits, absentAnswers, misses, evictions)
    hits = 0; absentAnswers = 0; misses = 0; evictions = 0
    c
  }

  def size: Int = entries.size
  def sizeBytes: Long = entries.memoryBytes
  def bloomBytes: Long = if (bloom == null) 0L else bloom.bytes

  /** The cached value (a copy), [[Absent]] when the key is surely not in the version, or null (unknown). */
  def lookup(key: Bytes): Array[Byte] = {
    lookups += 1
    val v = entries.get(key.bytes, key.hashCode)
    if (v != null) { hits += 1; reReads += 1; v }
    else if (complete) { absentAnswers += 1; Absent }
    else if (bloom != null && !bloom.mightContain(key.hashCode)) { absentAnswers += 1; lastAbsent = key; Absent }
    else { misses += 1; null }
  }

  /** A committed value, from a commit or a read; returns whether the key was cached before. */
  def put(key: Bytes, value: Array[Byte]): Boolean = store(key, value, index = true)

  /** `index`: the key may be missing from the Bloom filter (a partial cache's filter must hold
   *  every key of the version; adding a key it holds again only fills it). */
  private def store(key: Bytes, value: Array[Byte], index: Boolean): Boolean = {
    lastAbsent = null
    val existed = entries.put(key.bytes, key.hashCode, value)
    if (index && bloom != null && !existed) addToBloom(key.hashCode)
    settle()
    existed
  }

  /** A committed value a miss found: always admitted (a read is what admission waits for); the
   *  filter holds the key already. */
  def putRead(key: Bytes, value: Array[Byte]): Boolean = {
    reReads += 1
    store(key, value, index = false)
  }

  /** Whether written keys the cache lacks are admitted (see [[review]]). */
  def admitsWrites: Boolean = admitWrites

  /**
   * After a commit: decides from the reads since the last review whether written keys are
   * admitted. Under [[ReReadsToStop]] of at least [[MinLookups]] lookups, it stops and drops the
   * entries (a Bloom filter over every key takes over their answers); at [[ReReadsToResume]] or
   * more it admits them again.
   */
  def review(): Unit = {
    if (lookups >= MinLookups) {
      if (admitWrites && reReads < lookups * ReReadsToStop) { admitWrites = false; dropEntries() }
      else if (!admitWrites && reReads >= lookups * ReReadsToResume) admitWrites = true
    }
    lookups = 0; reReads = 0
  }

  /** Forgets every value but keeps answering absences (a partial cache's filter covers its keys). */
  private def dropEntries(): Unit = {
    goPartial()
    entries.clear()
    recharge()
  }

  /** A complete cache stops claiming every key: every key of the version is here right now, so
   *  a filter over them is exact. It is filled from the hashes the index holds, without
   *  reading a key, as this happens inside a commit (dedup's first review: 500k keys a
   *  partition, 20-50 ms alone, more on a busy executor). */
  private def goPartial(): Unit = if (complete) {
    if (bloom == null) startBloom(bloomCapacityFor(entries.size))
    entries.foreachHash(addToBloom)
    complete = false
    recharge()
  }

  def remove(key: Bytes): Boolean = {
    val existed = entries.remove(key.bytes, key.hashCode)
    if (existed) settle()
    existed
  }

  /**
   * Takes one committed write and says what was known of the key before it, as a changelog op
   * ([[ChangelogFormat]]): one map operation per write, on the commit's hot path.
   */
  def commitWrite(key: Bytes, value: Array[Byte]): Byte =
    if (value eq WriteBuffer.Tombstone) {
      val knownAbsent = this.knownAbsent(key)
      if (remove(key)) ChangelogFormat.OpDeleteExisting
      else if (knownAbsent) 0.toByte // deleting an absent key changes nothing: not logged
      else ChangelogFormat.OpDelete
    } else {
      val knownAbsent = this.knownAbsent(key)
      if (admitWrites || entries.presence(key.bytes, key.hashCode) != BytesMap.Missing) {
        // Only a key surely absent can be missing from the filter: one it may hold is not added again.
        if (store(key, value, index = knownAbsent)) ChangelogFormat.OpPutExisting
        else if (knownAbsent) ChangelogFormat.OpPutNew
        else ChangelogFormat.OpPut
      } else {
        // Not admitted: only the filter learns the key (a partial cache without one, cold after
        // a load, answers nothing as absent and needs none). A complete one (scanned in since
        // the review) would claim the key absent: it goes partial first.
        goPartial()
        if (bloom != null && knownAbsent) addToBloom(key.hashCode)
        if (knownAbsent) ChangelogFormat.OpPutNew else ChangelogFormat.OpPut
      }
    }

  /** Whether `key` is surely not in the version (before a write of it, which forgets the last
   *  absent answer). */
  private def knownAbsent(key: Bytes): Boolean = {
    val answered = lastAbsent != null && lastAbsent == key
    lastAbsent = null
    answered || complete || (bloom != null && !bloom.mightContain(key.hashCode))
  }

  /** Charges what the entries hold now; drops old pages while the shared budget is exceeded,
   *  rewrites the pages when replaced values left more garbage than data. */
  private def settle(): Unit = {
    recharge()
    if (CacheBudget.over && entries.pageCount > 0) evict()
    else if (entries.wasteful) { entries.compact(); recharge() }
  }

  private def recharge(): Unit = {
    val now = entries.memoryBytes
    CacheBudget.add(now - charged)
    charged = now
  }

  /** Evicts while the shared budget is exceeded (after a commit: an overlay may have grown). */
  def holdBudget(): Unit = if (CacheBudget.over && entries.pageCount > 0) evict()

  /** Drop the oldest pages until the shared budget holds; keep answering absences. */
  private def evict(): Unit = {
    goPartial()
    while (CacheBudget.over && entries.pageCount > 0) {
      evictions += entries.dropOldestPage()
      recharge()
    }
  }

  /** Pages of ~1/64 of the shared budget (at most a quarter of what is left of it), so that the
   *  budget holds within a page and FIFO eviction is fine-grained. */
  private def pageSize(): Int = {
    val room = math.min(CacheBudget.limitBytes / 64, math.max(0L, CacheBudget.limitBytes - CacheBudget.usedBytes) / 4)
    if (room >= BytesMap.MaxPage) BytesMap.MaxPage else java.lang.Long.highestOneBit(math.max(room, 1L)).toInt
  }

  /** Room for twice `keys` (the state grows), at least [[MinBloomCapacity]] unless that would
   *  take more than half of what the shared budget leaves this cache (other caches' use aside). */
  def bloomCapacityFor(keys: Long): Long = {
    val room = math.max(0L, CacheBudget.limitBytes - (CacheBudget.usedBytes - charged - bloomBytes))
    val fitting = (room.toDouble * 8 / 2 / bitsPerKey).toLong
    math.max(math.max(1024L, math.min(MinBloomCapacity, fitting)), 2L * keys)
  }

  /** A new (empty) filter for `capacity` keys; its bits count against the shared budget. */
  def startBloom(capacity: Long): Unit = {
    val before = bloomBytes
    bloom = new KeyFilter(capacity, fpp)
    lastAbsent = null
    CacheBudget.add(bloomBytes - before)
  }

  /**
   * Replaces the filter by one over every key `scanKeys` gives (the version's, `numKeys` of
   * them), and marks the cache partial. Built aside: a scan that fails halfway leaves the old
   * filter, which still holds every key, instead of one that would call the rest absent.
   */
  def rebuildBloom(numKeys: Long)(scanKeys: (Array[Byte] => Unit) => Unit): Unit = {
    val fresh = new KeyFilter(bloomCapacityFor(numKeys), fpp)
    scanKeys(key => fresh.add(Bytes.hashOf(key), 0L))
    val before = bloomBytes
    bloom = fresh
    complete = false
    lastAbsent = null
    CacheBudget.add(bloomBytes - before)
  }

  /** Adds a key (its [[Bytes.hashOf]]) to the filter; a new stage may take at most half of what
   *  the shared budget has left (as [[bloomCapacityFor]]), else the newest stage fills past its
   *  size until a load rescans ([[bloomSaturated]]). */
  def addToBloom(keyHash: Int): Unit = {
    val grown = bloom.add(keyHash, (CacheBudget.limitBytes - CacheBudget.usedBytes) / 2)
    if (grown > 0) CacheBudget.add(grown)
  }

  /** True when the filter has grown into so many stages that a rescan into one is cheaper than
   *  asking each of them on every read, or its newest stage holds more than it was sized for. */
  def bloomSaturated: Boolean = bloom != null && (bloom.stageCount > MaxBloomStages || bloom.overfull)

  /** Forget everything (another version is being loaded). */
  def clear(): Unit = {
    lookups = 0; reReads = 0; lastAbsent = null
    entries.clear()
    CacheBudget.add(-bloomBytes)
    recharge()
    bloom = null
    complete = false
  }

  /** A point-in-time copy of every entry, for iterators (only meaningful when complete). */
  def snapshot(): Array[(Array[Byte], Array[Byte])] = entries.toArray
}

object NearCache {
  /** Marker for "surely absent"; never stored. */
  val Absent: Array[Byte] = new Array[Byte](0)
  val MinBloomCapacity = 1L << 20
  /** Stages of a growing filter (each twice the last: 15x the first's keys at 4) before a load
   *  rescans the keys into one. */
  val MaxBloomStages = 4
  /** Fewer lookups than this since the last review decide nothing. */
  val MinLookups = 1000L
  /** Share of lookups that found their key under which written keys stop being admitted... */
  val ReReadsToStop = 0.01
  /** ...and at or over which they are admitted again (apart, so that admission does not flap). */
  val ReReadsToResume = 0.05
}
