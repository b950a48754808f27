package io.keyedstate.engine

import org.apache.parquet.column.values.bloomfilter.BlockSplitBloomFilter
import org.apache.spark.sql.catalyst.expressions.XXH64
import org.apache.spark.unsafe.Platform

/**
 * The near cache's Bloom filter over a store's keys, which grows without a rescan of the state
 * (a scalable Bloom filter, Almeida et al., 2007): when the newest stage holds the keys it was
 * sized for, a stage twice as large takes the next ones, at half the false-positive rate, so
 * all stages together stay under twice `fpp`. A key may be in any stage, so an absence needs
 * every stage's answer; [[NearCache.bloomSaturated]] asks for a rescan into one stage when there
 * are many, or when a stage did not fit the memory it may take and filled past its size.
 * Without stages, a store whose keys outgrow the filter (dedup) rescans all of them.
 *
 * Each stage is a split-block Bloom filter (Parquet's, in Spark's jars): a key sets and probes
 * 8 bits of one 32-byte block, one cache line, where a classic filter probes 7 lines; a key is
 * hashed once (Spark's XXH64), in place, so a cache's pages are indexed without copying keys.
 * Parquet rounds a stage's bytes up to a power of two, which lowers its rate below the target.
 */
final class KeyFilter(capacity: Long, fpp: Double) {
  import KeyFilter._

  private var stages: List[BlockSplitBloomFilter] = List(stage(capacity, fpp))
  private var stageCapacity = capacity
  private var stageFpp = fpp
  private var stageItems = 0L

  def bytes: Long = stages.iterator.map(_.getBitsetSize.toLong).sum
  def stageCount: Int = stages.size

  def mightContain(key: Array[Byte]): Boolean = mightContainHash(hash(key, 0, key.length))
  def mightContainHash(h: Long): Boolean = stages.exists(_.findHash(h))

  /** The newest stage holds more keys than it was sized for (its answers degrade). */
  def overfull: Boolean = stageItems > stageCapacity

  /** Adds `key`, in a new stage if the newest is full and the new one's bits fit in `room`
   *  bytes; returns the bytes a new stage took (0 if none). */
  def add(key: Array[Byte], room: Long): Long = addHash(hash(key, 0, key.length), room)

  /** [[add]] of a key by its [[KeyFilter.hash]]. */
  def addHash(h: Long, room: Long): Long = {
    var grown = 0L
    if (stageItems >= stageCapacity && stageBytes(2 * stageCapacity, stageFpp / 2) <= room) {
      stageCapacity *= 2
      stageFpp /= 2
      val next = stage(stageCapacity, stageFpp)
      stages = next :: stages
      stageItems = 0
      grown = next.getBitsetSize
    }
    stages.head.insertHash(h)
    stageItems += 1
    grown
  }
}

object KeyFilter {
  private val Seed = 42L

  /** The filter's hash of the key in `bytes(at until at + len)`. */
  def hash(bytes: Array[Byte], at: Int, len: Int): Long =
    XXH64.hashUnsafeBytes(bytes, Platform.BYTE_ARRAY_OFFSET + at, len, Seed)

  private def stage(keys: Long, fpp: Double): BlockSplitBloomFilter = new BlockSplitBloomFilter(stageBytes(keys, fpp))

  /** Bytes of a stage for `keys` at `fpp`, as Parquet sizes it (a power of two in its bounds). */
  private def stageBytes(keys: Long, fpp: Double): Int = {
    val wanted = math.max(BlockSplitBloomFilter.LOWER_BOUND_BYTES,
      math.min(BlockSplitBloomFilter.UPPER_BOUND_BYTES, BlockSplitBloomFilter.optimalNumOfBits(keys, fpp) / 8))
    if (Integer.bitCount(wanted) == 1) wanted else Integer.highestOneBit(wanted) << 1
  }
}
