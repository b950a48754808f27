package io.keyedstate.engine

import java.util.concurrent.atomic.AtomicLong

import io.keyedstate.format.ChangelogFormat

/**
 * Near-cache memory shared by every store of this executor JVM: entries (with their object
 * overhead) and Bloom filters. Each store that opens sets the limit from its `nearCacheBytes`
 * (`auto` = 30% of the JVM's max heap, or its share of `memoryBudget`); the stores of one query
 * share their confs, so in practice one value applies. Caches evict as they next insert.
 */
object CacheBudget {
  private val used = new AtomicLong
  @volatile private var limit = Long.MaxValue

  def configure(bytes: Long): Unit =
    limit = if (bytes >= 0) bytes else (Runtime.getRuntime.maxMemory * 0.3).toLong
  def limitBytes: Long = limit
  def usedBytes: Long = used.get
  def add(delta: Long): Long = used.addAndGet(delta)
  def over: Boolean = used.get > limit
}

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
 * Entries that are never read back are heap for nothing: a dedup or a first-seen-key state
 * writes every key once and reads it never, so a cache that keeps its writes grows with the
 * state (W2: 0.5 GB of heap for 7M keys, zero hits) until the budget stops it. [[review]]
 * (after each commit) notices versions that write many keys and hit almost none, and then
 * *retires* the cache: its entries go, a Bloom filter keeps answering "absent", and writes of
 * keys not cached are no longer admitted. Reads that find a value are still cached, so once
 * reads hit again (an aggregation's keys come back) writes are admitted again.
 */
final class NearCache(fpp: Double) {
  import NearCache._

  private val entries = new BytesMap(() => pageSize())
  private var charged = 0L // bytes of `entries` counted in CacheBudget
  private var bloom: GrowingBloom = _
  // The last key the filter answered "absent" for, and its hash: an operator's put follows its
  // get of the same key (dedup, a new aggregation key), so the put need not ask again. Any
  // change to the filter or the entries forgets it.
  private var lastAbsent: Array[Byte] = _
  private var lastAbsentHash = 0L
  var complete = false
  /** Whether writes of keys not cached enter the cache (false once [[review]] retired it). */
  private var admitting = true
  // Of the version being written, for [[review]]: cache hits and writes; versions in a row
  // that wrote at least ReviewMinWrites keys and hit fewer than 1% of them.
  private var versionHits = 0L
  private var versionWrites = 0L
  private var idleVersions = 0
  private var scannedFully = false

  // Counters since the last metrics report.
  private var hits = 0L
  private var absentAnswers = 0L
  private var misses = 0L
  private var evictions = 0L

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
    val v = entries.get(key.bytes, key.hashCode)
    if (v != null) { hits += 1; versionHits += 1; v }
    else if (complete || filterSaysAbsent(key)) { absentAnswers += 1; Absent }
    else { misses += 1; null }
  }

  /** A committed value a read found: the filter (if any) already holds every committed key. */
  def putRead(key: Bytes, value: Array[Byte]): Unit = {
    entries.put(key.bytes, key.hashCode, value)
    lastAbsent = null
    settle()
  }

  /** A committed value, from a commit or a read; returns whether the key was cached before. */
  def put(key: Bytes, value: Array[Byte]): Boolean = {
    val existed = entries.put(key.bytes, key.hashCode, value)
    if (bloom != null && !existed) addToBloom(key.bytes)
    lastAbsent = null
    settle()
    existed
  }

  def remove(key: Bytes): Boolean = {
    lastAbsent = null
    val existed = entries.remove(key.bytes, key.hashCode)
    if (existed) settle()
    existed
  }

  /**
   * Takes one committed write and says what was known of the key before it, as a changelog op
   * ([[ChangelogFormat]]): one map operation per write, on the commit's hot path.
   */
  def commitWrite(key: Bytes, value: Array[Byte]): Byte = {
    versionWrites += 1
    if (value eq WriteBuffer.Tombstone) {
      val knownAbsent = complete || filterSaysAbsent(key)
      if (remove(key)) { versionHits += 1; ChangelogFormat.OpDeleteExisting }
      else if (knownAbsent) 0.toByte // deleting an absent key changes nothing: not logged
      else ChangelogFormat.OpDelete
    } else {
      val knownAbsent = complete || filterSaysAbsent(key)
      if (!admitting && entries.presence(key.bytes, key.hashCode) == BytesMap.Missing) {
        // Retired: the key is not cached; a new one must enter the filter (one the filter may
        // hold already has all its bits set: adding it would change nothing).
        if (knownAbsent && bloom != null) { addToBloom(key.bytes); settle() }
        if (knownAbsent) ChangelogFormat.OpPutNew else ChangelogFormat.OpPut
      }
      else if (put(key, value)) { versionHits += 1; ChangelogFormat.OpPutExisting }
      else if (knownAbsent) ChangelogFormat.OpPutNew
      else ChangelogFormat.OpPut
    }
  }

  /** Whether writes of keys not cached enter the cache (see [[review]]). */
  def admitsWrites: Boolean = admitting

  /** A full scan of the version was served from the entries (a join's or a watermarked
   *  dedup's eviction): the entries are read back, the version is not idle. */
  def servedFullScan(): Unit = scannedFully = true

  /**
   * After a version committed: retires the cache when [[IdleVersionsToRetire]] versions in a
   * row each wrote at least [[ReviewMinWrites]] keys, used the cache for fewer than 1% of that
   * (hits, and writes or deletes of cached keys) and scanned it never: their entries are not read
   * back. Smaller versions say nothing either way, unless they hit. Admits writes again once a
   * version's reads hit as often. Returns whether it retired the cache now.
   */
  def review(): Boolean = {
    val used = scannedFully || (versionHits > 0 && versionHits * 100 >= versionWrites)
    if (used) idleVersions = 0
    else if (versionWrites >= ReviewMinWrites) idleVersions += 1
    val retire = admitting && idleVersions >= IdleVersionsToRetire && entries.size > 0
    if (retire) {
      goPartial()
      entries.clear()
      recharge()
      admitting = false
    } else if (!admitting && used) admitting = true
    versionHits = 0
    versionWrites = 0
    scannedFully = false
    retire
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

  /** Drop the oldest pages until the shared budget holds; keep answering absences. */
  private def evict(): Unit = {
    goPartial()
    while (CacheBudget.over && entries.pageCount > 0) {
      evictions += entries.dropOldestPage()
      recharge()
    }
  }

  /** From complete to partial: every key of the version is here right now, so a filter built
   *  from the entries is exact. */
  private def goPartial(): Unit = if (complete) {
    startBloom(bloomCapacityFor(entries.size))
    entries.foreachKey(addToBloom)
    complete = false
    recharge()
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
    val bitsPerKey = GrowingBloom.bitsPerKey(fpp)
    val room = math.max(0L, CacheBudget.limitBytes - (CacheBudget.usedBytes - charged - bloomBytes))
    val fitting = (room.toDouble * 8 / 2 / bitsPerKey).toLong
    math.max(math.max(1024L, math.min(MinBloomCapacity, fitting)), 2L * keys)
  }

  /** A new (empty) filter for `capacity` keys; its bits count against the shared budget. */
  def startBloom(capacity: Long): Unit = {
    val before = bloomBytes
    bloom = new GrowingBloom(capacity, fpp)
    lastAbsent = null
    CacheBudget.add(bloomBytes - before)
  }

  def addToBloom(key: Array[Byte]): Unit = {
    val h = if (lastAbsent != null && java.util.Arrays.equals(lastAbsent, key)) lastAbsentHash else GrowingBloom.hash(key)
    lastAbsent = null
    val grown = bloom.putHash(h)
    if (grown > 0) CacheBudget.add(grown)
  }

  /** Whether the Bloom filter (if any) says `key` is surely absent. */
  private def filterSaysAbsent(key: Bytes): Boolean =
    if (bloom == null) false
    else if (lastAbsent != null && java.util.Arrays.equals(lastAbsent, key.bytes)) true
    else {
      val h = GrowingBloom.hash(key.bytes)
      val absent = !bloom.mightContainHash(h)
      if (absent) { lastAbsent = key.bytes; lastAbsentHash = h }
      absent
    }

  /** True when the filter grew so often that one filter sized from a scan would be smaller and
   *  faster to ask (the next load rebuilds it: [[CacheWarmer.indexKeys]]). */
  def bloomSaturated: Boolean = bloom != null && bloom.generations > MaxBloomGenerations

  /** Forget everything (another version is being loaded); whether writes are admitted stays,
   *  it describes the workload, not the version. */
  def clear(): Unit = {
    versionHits = 0
    versionWrites = 0
    scannedFully = false
    entries.clear()
    CacheBudget.add(-bloomBytes)
    recharge()
    bloom = null
    lastAbsent = null
    complete = false
  }

  /** A point-in-time copy of every entry, for iterators (only meaningful when complete). */
  def snapshot(): Array[(Array[Byte], Array[Byte])] = entries.toArray
}

final case class CacheCounters(hits: Long, absent: Long, misses: Long, evictions: Long)

object NearCache {
  /** Marker for "surely absent"; never stored. */
  val Absent: Array[Byte] = new Array[Byte](0)
  val MinBloomCapacity = 1L << 20
  /** Filters a [[GrowingBloom]] may grow to before a scan rebuilds it as one: 15x the keys it
   *  was sized for. */
  val MaxBloomGenerations = 4
  /** A version that writes fewer keys (in one partition) says little about whether its entries
   *  are read back. */
  val ReviewMinWrites = 4096L
  /** Idle versions in a row before the cache retires: an aggregation's first version (every
   *  key new, nothing to hit) must not retire a cache that its next version hits throughout. */
  val IdleVersionsToRetire = 2
}
