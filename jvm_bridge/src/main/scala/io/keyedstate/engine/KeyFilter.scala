package io.keyedstate.engine

import org.apache.spark.util.sketch.BloomFilter

/**
 * The near cache's Bloom filter over a store's keys, which grows without a rescan of the state
 * (a scalable Bloom filter, Almeida et al., 2007): when the newest stage holds the keys it was
 * sized for, a stage twice as large takes the next ones, at half the false-positive rate, so
 * all stages together stay under twice `fpp`. A key may be in any stage, so an absence needs
 * every stage's answer; [[NearCache.bloomSaturated]] asks for a rescan into one stage when there
 * are many, or when a stage did not fit the memory it may take and filled past its size.
 * Without stages, a store whose keys outgrow the filter (dedup) rescans all of them.
 */
final class KeyFilter(capacity: Long, fpp: Double) {
  private var stages: List[BloomFilter] = List(BloomFilter.create(capacity, fpp))
  private var stageCapacity = capacity
  private var stageFpp = fpp
  private var stageItems = 0L

  def bytes: Long = stages.iterator.map(_.bitSize() / 8).sum
  def stageCount: Int = stages.size

  def mightContain(key: Array[Byte]): Boolean = stages.exists(_.mightContainBinary(key))

  /** The newest stage holds more keys than it was sized for (its answers degrade). */
  def overfull: Boolean = stageItems > stageCapacity

  /** Adds `key`, in a new stage if the newest is full and the new one's bits fit in `room`
   *  bytes; returns the bytes a new stage took (0 if none). */
  def add(key: Array[Byte], room: Long): Long = {
    var grown = 0L
    if (stageItems >= stageCapacity && nextStageBytes <= room) {
      stageCapacity *= 2
      stageFpp /= 2
      val stage = BloomFilter.create(stageCapacity, stageFpp)
      stages = stage :: stages
      stageItems = 0
      grown = stage.bitSize() / 8
    }
    stages.head.putBinary(key)
    stageItems += 1
    grown
  }

  /** Bytes of the next stage's bits (Spark's sketch sizes a filter this way, in whole longs). */
  private def nextStageBytes: Long = {
    val bits = (-2 * stageCapacity * math.log(stageFpp / 2) / (math.log(2) * math.log(2))).toLong
    (bits + 63) / 64 * 8
  }
}
