package io.keyedstate.engine

import java.util.concurrent.atomic.AtomicLong

import org.apache.spark.util.sketch.BloomFilter

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
 * budget forces evictions (LRU), a Bloom filter over every key keeps answering "absent"
 * without a read for most new keys (dedup, first-seen keys). Single-threaded: only the
 * task thread that owns the partition touches it.
 */
final class NearCache(fpp: Double) {
  import NearCache._

  private val entries = new java.util.LinkedHashMap[Bytes, Array[Byte]](1024, 0.75f, true)
  private var bytes = 0L
  private var bloom: BloomFilter = _
  private var bloomItems = 0L
  private var bloomCapacity = 0L
  var complete = false

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
  def sizeBytes: Long = bytes
  def bloomBytes: Long = if (bloom == null) 0L else bloom.bitSize() / 8

  /** The cached value, [[Absent]] when the key is surely not in the version, or null (unknown). */
  def lookup(key: Bytes): Array[Byte] = {
    val v = entries.get(key)
    if (v != null) { hits += 1; v }
    else if (complete || (bloom != null && !bloom.mightContainBinary(key.bytes))) { absentAnswers += 1; Absent }
    else { misses += 1; null }
  }

  /** A committed value, from a commit or a read; returns the previous cached value. */
  def put(key: Bytes, value: Array[Byte]): Array[Byte] = {
    val previous = entries.put(key, value)
    val delta = if (previous == null) entryBytes(key, value) else (value.length - previous.length).toLong
    bytes += delta
    if (bloom != null && previous == null) addToBloom(key.bytes)
    if (CacheBudget.add(delta) > CacheBudget.limitBytes) evict()
    previous
  }

  def remove(key: Bytes): Array[Byte] = {
    val previous = entries.remove(key)
    if (previous != null) {
      val delta = entryBytes(key, previous)
      bytes -= delta
      CacheBudget.add(-delta)
    }
    previous
  }

  /**
   * Takes one committed write and says what was known of the key before it, as a changelog op
   * ([[ChangelogFormat]]): one map operation per write, on the commit's hot path.
   */
  def commitWrite(key: Bytes, value: Array[Byte]): Byte =
    if (value eq WriteBuffer.Tombstone) {
      val knownAbsent = complete || (bloom != null && !bloom.mightContainBinary(key.bytes))
      if (remove(key) != null) ChangelogFormat.OpDeleteExisting
      else if (knownAbsent) 0.toByte // deleting an absent key changes nothing: not logged
      else ChangelogFormat.OpDelete
    } else {
      val knownAbsent = complete || (bloom != null && !bloom.mightContainBinary(key.bytes))
      if (put(key, value) != null) ChangelogFormat.OpPutExisting
      else if (knownAbsent) ChangelogFormat.OpPutNew
      else ChangelogFormat.OpPut
    }

  /** Drop least recently used entries until the shared budget holds; keep answering absences. */
  private def evict(): Unit = {
    if (complete) {
      // Going partial: every key of the version is here right now, so the filter is exact.
      startBloom(bloomCapacityFor(entries.size))
      entries.keySet().forEach(k => addToBloom(k.bytes))
      complete = false
    }
    val it = entries.entrySet().iterator()
    while (CacheBudget.over && it.hasNext) {
      val e = it.next()
      val delta = entryBytes(e.getKey, e.getValue)
      it.remove()
      bytes -= delta
      CacheBudget.add(-delta)
      evictions += 1
    }
  }

  /** Room for twice `keys` (the state grows), at least [[MinBloomCapacity]] unless that would
   *  take more than half the shared budget. */
  def bloomCapacityFor(keys: Long): Long = {
    val bitsPerKey = -math.log(fpp) / (math.log(2) * math.log(2))
    val fitting = (CacheBudget.limitBytes.toDouble * 8 / 2 / bitsPerKey).toLong
    math.max(math.max(1024L, math.min(MinBloomCapacity, fitting)), 2L * keys)
  }

  /** A new (empty) filter for `capacity` keys; its bits count against the shared budget. */
  def startBloom(capacity: Long): Unit = {
    val before = bloomBytes
    bloom = BloomFilter.create(capacity, fpp)
    bloomItems = 0
    bloomCapacity = capacity
    CacheBudget.add(bloomBytes - before)
  }

  def addToBloom(key: Array[Byte]): Unit = {
    bloom.putBinary(key)
    bloomItems += 1
  }

  /** True when the filter holds more keys than it was sized for (its answers degrade). */
  def bloomSaturated: Boolean = bloom != null && bloomItems > bloomCapacity

  /** Forget everything (another version is being loaded). */
  def clear(): Unit = {
    CacheBudget.add(-bytes - bloomBytes)
    entries.clear()
    bytes = 0
    bloom = null
    complete = false
  }

  /** A point-in-time copy of every entry, for iterators (only meaningful when complete). */
  def snapshot(): Array[(Array[Byte], Array[Byte])] = {
    val out = new Array[(Array[Byte], Array[Byte])](entries.size)
    var i = 0
    entries.forEach { (k, v) => out(i) = (k.bytes, v); i += 1 }
    out
  }
}

final case class CacheCounters(hits: Long, absent: Long, misses: Long, evictions: Long)

object NearCache {
  /** Marker for "surely absent"; never stored. */
  val Absent: Array[Byte] = new Array[Byte](0)
  val MinBloomCapacity = 1L << 20
  /** Heap of one entry beyond its key and value bytes (compressed oops): the LinkedHashMap entry
   *  (40), the Bytes wrapper (24), two array headers (2 x 16) and the table slot at the map's
   *  load factor (~8); the arrays are padded to 8 bytes. */
  private val EntryOverhead = 104L
  private def padded(n: Int): Long = (n + 7L) & ~7L
  def entryBytes(key: Bytes, value: Array[Byte]): Long = padded(key.bytes.length) + padded(value.length) + EntryOverhead
}
