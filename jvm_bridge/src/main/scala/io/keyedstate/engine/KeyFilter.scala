package io.keyedstate.engine

/**
 * The near cache's Bloom filter over a store's keys, which grows without a rescan of the state
 * (a scalable Bloom filter, Almeida et al., 2007): when the newest stage holds the keys it was
 * sized for, a stage twice as large takes the next ones, at half the false-positive rate, so
 * all stages together stay under twice `fpp`. A key may be in any stage, so an absence needs
 * every stage's answer; [[NearCache.bloomSaturated]] asks for a rescan into one stage when there
 * are many, or when a stage did not fit the memory it may take and filled past its size.
 * Without stages, a store whose keys outgrow the filter (dedup) rescans all of them.
 *
 * A key enters as its [[Bytes.hashOf]], the hash the near cache's index already holds, so that
 * filling a filter from a cache (when it stops holding every key) reads no key and hashes none.
 * Keys with one 32-bit hash are one key to the filter: that adds n / 2^32 to the
 * false-positive rate (0.02% at 1M keys in a store), and a false positive costs a native read,
 * never a wrong answer.
 */
final class KeyFilter(capacity: Long, fpp: Double) {
  import KeyFilter.BlockBloom

  private var stages: List[BlockBloom] = List(new BlockBloom(capacity, fpp))
  private var stageCapacity = capacity
  private var stageFpp = fpp
  private var stageItems = 0L
  private var nextStageBytes = KeyFilter.stageBytes(capacity * 2, fpp / 2)

  def bytes: Long = stages.iterator.map(_.bytes).sum
  def stageCount: Int = stages.size

  /** Whether a key of this [[Bytes.hashOf]] may have been added. */
  def mightContain(keyHash: Int): Boolean = {
    val h = KeyFilter.spread(keyHash)
    var s = stages
    while (s.nonEmpty) { if (s.head.mightContain(h)) return true; s = s.tail }
    false
  }

  /** The newest stage holds more keys than it was sized for (its answers degrade). */
  def overfull: Boolean = stageItems > stageCapacity

  /** Adds the key of this [[Bytes.hashOf]], in a new stage if the newest is full and the new
   *  one's bits fit in `room` bytes; returns the bytes a new stage took (0 if none). */
  def add(keyHash: Int, room: Long): Long = {
    var grown = 0L
    if (stageItems >= stageCapacity && nextStageBytes <= room) {
      stageCapacity *= 2
      stageFpp /= 2
      val stage = new BlockBloom(stageCapacity, stageFpp)
      stages = stage :: stages
      stageItems = 0
      grown = stage.bytes
      nextStageBytes = KeyFilter.stageBytes(stageCapacity * 2, stageFpp / 2)
    }
    stages.head.put(KeyFilter.spread(keyHash))
    stageItems += 1
    grown
  }
}

object KeyFilter {
  /**
   * Bits a key takes in a stage sized for `fpp` (what [[NearCache.bloomCapacityFor]] budgets):
   * the fewest at which a split-block filter's false-positive rate is at most `fpp`. Keys fall
   * on blocks as a Poisson process of mean `256 / bits`; a probe passes a block holding k keys
   * with chance (1 - (31/32)^k)^8 (one bit in each of eight 32-bit words), averaged over k.
   */
  def bitsPerKey(fpp: Double): Double = {
    var lo = 1.0
    var hi = 4096.0
    while (hi - lo > 0.01) {
      val mid = (lo + hi) / 2
      if (falsePositiveRate(mid) > fpp) lo = mid else hi = mid
    }
    hi
  }

  /** A split-block filter's false-positive rate at `bits` a key (see [[bitsPerKey]]). */
  def falsePositiveRate(bits: Double): Double = {
    val mean = 256 / bits
    var k = 0
    var poisson = math.exp(-mean) // P(k keys in the block)
    var rate = 0.0
    val last = (mean + 12 * math.sqrt(mean) + 30).toInt
    while (k <= last) {
      rate += poisson * math.pow(-math.expm1(k * math.log1p(-1.0 / 32)), 8)
      k += 1
      poisson *= mean / k
    }
    rate
  }

  /** Bytes of a stage for `keys` keys at `fpp`: whole 32-byte blocks, at least one. */
  def stageBytes(keys: Long, fpp: Double): Long = blocksFor(keys, fpp) * 32L

  private def blocksFor(keys: Long, fpp: Double): Int = {
    val blocks = math.ceil(math.max(1L, keys) * bitsPerKey(fpp) / 256).toLong
    math.max(1L, math.min(blocks, Int.MaxValue / 4)).toInt
  }

  /** The 32-bit key hash spread over 64 bits (Murmur3's finalizer, a bijection): the high half
   *  picks a block, the low half the bits in it. */
  private def spread(keyHash: Int): Long = {
    var h = keyHash.toLong
    h ^= h >>> 33; h *= 0xff51afd7ed558ccdL
    h ^= h >>> 33; h *= 0xc4ceb9fe1a85ec53L
    h ^ (h >>> 33)
  }

  /** Odd multipliers that pick a key's bit in each of a block's eight words (those of Parquet's
   *  and Impala's split-block filters). */
  private val Salt = Array(0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31)

  /**
   * One stage: a split-block Bloom filter (Putze et al., 2007; the layout of Parquet's and
   * Impala's): a key sets one bit in each of the eight 32-bit words of one 256-bit block, so an
   * insert or a probe touches one cache line instead of k scattered ones (what makes filling a
   * filter over 500k keys cheap inside a commit), at ~10% more bits than a classic filter of
   * the same rate (10.5 bits a key at 1%, against 9.6). No scratch state in a probe.
   */
  private final class BlockBloom(keys: Long, fpp: Double) {
    private val blocks = blocksFor(keys, fpp)
    private val words = new Array[Long](blocks * 4) // a block's eight 32-bit words, two per long

    def bytes: Long = words.length * 8L

    def put(h: Long): Unit = {
      val base = block(h)
      val key = h.toInt
      var i = 0
      while (i < 8) {
        words(base + (i >> 1)) |= bit(key, i)
        i += 1
      }
    }

    def mightContain(h: Long): Boolean = {
      val base = block(h)
      val key = h.toInt
      var i = 0
      while (i < 8) {
        if ((words(base + (i >> 1)) & bit(key, i)) == 0) return false
        i += 1
      }
      true
    }

    private def block(h: Long): Int = (((h >>> 32) * blocks) >>> 32).toInt * 4
    private def bit(key: Int, i: Int): Long = 1L << (((i & 1) << 5) + ((key * Salt(i)) >>> 27))
  }
}
