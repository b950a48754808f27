package io.keyedstate.engine

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.sql.catalyst.expressions.XXH64
import org.apache.spark.unsafe.Platform

/**
 * The near cache's "surely absent" filter over every key of a store: a Bloom filter that grows
 * without reading its keys again. When the newest filter holds as many keys as it was sized
 * for, another one twice as large with half its false-positive rate takes the next keys (a
 * scalable Bloom filter, Almeida et al., 2007). A key might be present when any filter says so;
 * the first filter gets half of `fpp`, so the rate of the whole stays below `fpp` however many
 * filters it grows (about: later generations ask more bits of one block, whose rate the +20%
 * below only approximates; measured at 4 generations in the tests).
 *
 * Each filter is blocked (Putze et al., 2007): all of a key's bits lie in one 512-bit block, one
 * cache line (two at most: the array's data is not line-aligned), so asking costs one or two memory misses instead of one per bit (W2 asks for every row,
 * several times, of filters of tens of MB), for ~20% more bits at the same rate. One 64-bit hash
 * per key serves every filter.
 *
 * Why it grows instead of being rebuilt: the stores it serves grow (dedup: a million keys a
 * batch), and rebuilding one filter from a scan of the store each time it filled cost seconds of
 * the batch that found it full.
 */
final class GrowingBloom(capacity: Long, fpp: Double) {
  import GrowingBloom._

  private val filters = ArrayBuffer(new Blocked(capacity, fpp / 2))
  private var newestItems = 0L
  private var bitBytes = filters.head.bytes

  def mightContain(key: Array[Byte]): Boolean = mightContainHash(hash(key))

  /** As [[mightContain]], for a key's [[GrowingBloom.hash]]. */
  def mightContainHash(h: Long): Boolean = {
    var i = filters.length - 1
    while (i >= 0) {
      if (filters(i).mightContain(h)) return true
      i -= 1
    }
    false
  }

  /** Adds `key`; returns the bytes the filter grew by (0 unless a new filter was added). */
  def put(key: Array[Byte]): Long = putHash(hash(key))

  /** As [[put]], for a key's [[GrowingBloom.hash]]. */
  def putHash(h: Long): Long = {
    var grown = 0L
    val newest = filters.last
    if (newestItems >= newest.capacity) {
      val next = new Blocked(newest.capacity * 2, newest.fpp / 2)
      filters += next
      newestItems = 0
      grown = next.bytes
      bitBytes += grown
    }
    filters.last.put(h)
    newestItems += 1
    grown
  }

  def bytes: Long = bitBytes
  def generations: Int = filters.length
}

object GrowingBloom {
  private val Seed = 0x6b657965L

  /** The one hash of a key that every filter uses. */
  def hash(key: Array[Byte]): Long = XXH64.hashUnsafeBytes(key, Platform.BYTE_ARRAY_OFFSET, key.length, Seed)

  private val Ln2 = math.log(2)

  /** Bits a key costs in a new filter for `fpp` (its first generation). */
  def bitsPerKey(fpp: Double): Double = Blocked.bitsPerKey(fpp / 2)

  object Blocked {
    /** A classic filter's bits per key at this rate, +20% for blocking. */
    def bitsPerKey(fpp: Double): Double = -math.log(fpp) / (Ln2 * Ln2) * 1.2
  }

  /** One blocked Bloom filter: blocks of 8 longs; a key's block from the hash's high bits, its
   *  `k` bits in the block from a multiplicative sequence seeded by the low bits. */
  final class Blocked(val capacity: Long, val fpp: Double) {
    private val bitsPerKey = Blocked.bitsPerKey(fpp)
    private val k = math.max(1, math.min(16, math.round(bitsPerKey / 1.2 * Ln2).toInt))
    private val blocks: Long = math.max(1L, math.ceil(math.max(capacity, 1L) * bitsPerKey / 512).toLong)
    require(blocks < (1L << 28), s"a Bloom filter for $capacity keys is too large")
    private val words = new Array[Long]((blocks * 8).toInt)

    def bytes: Long = words.length.toLong * 8

    private def block(h: Long): Int = ((((h >>> 32) * blocks) >>> 32).toInt) << 3

    def put(h: Long): Unit = {
      val base = block(h)
      var g = h | 1L
      var i = 0
      while (i < k) {
        g *= 0x9E3779B97F4A7C15L
        val bit = (g >>> 55).toInt // 0..511
        words(base + (bit >>> 6)) |= 1L << (bit & 63)
        i += 1
      }
    }

    def mightContain(h: Long): Boolean = {
      val base = block(h)
      var g = h | 1L
      var i = 0
      while (i < k) {
        g *= 0x9E3779B97F4A7C15L
        val bit = (g >>> 55).toInt
        if ((words(base + (bit >>> 6)) & (1L << (bit & 63))) == 0) return false
        i += 1
      }
      true
    }
  }
}
