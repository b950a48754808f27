package io.keyedstate.engine

/**
 * [[BytesMap]]'s index: open addressing with linear probing over `length` slots (a power of two,
 * load factor below 0.6), each a record address (0 = empty) and its key's hash. Deletion shifts
 * later entries back, so there are no tombstones and probes stay short. The slots live in
 * chunks of at most `1 << chunkBits` ([[BytesIndex.Slots]]): none of its arrays is humongous.
 * The map compares keys; this knows only addresses and hashes.
 */
private[engine] final class BytesIndex(chunkBits: Int, expectedKeys: Int) {
  import BytesIndex._

  private var slots = new Slots(InitialSlots, chunkBits)
  private var mask = InitialSlots - 1
  private var count = 0

  def size: Int = count
  def length: Int = slots.length
  def chunkSlots: Array[Int] = slots.chunkSlots
  def address(slot: Int): Long = slots.address(slot)
  def hash(slot: Int): Int = slots.hash(slot)
  def setAddress(slot: Int, a: Long): Unit = slots.setAddress(slot, a)

  /** Where the probe for `hash` starts, and the slot after `slot`. */
  def home(hash: Int): Int = (hash * 0x9E3779B9) >>> (32 - Integer.numberOfTrailingZeros(mask + 1)) & mask
  def next(slot: Int): Int = (slot + 1) & mask

  /** The hash of every entry, in slot order. */
  def foreachHash(f: Int => Unit): Unit = {
    var slot = 0
    while (slot <= mask) {
      if (slots.address(slot) != 0L) f(slots.hash(slot))
      slot += 1
    }
  }

  /** The slot of the live record at address `a`, whose key hashes to `hash`. */
  def slotOfAddress(a: Long, hash: Int): Int = {
    var slot = home(hash)
    while (slots.address(slot) != a) {
      if (slots.address(slot) == 0L) throw new IllegalStateException("keyedstate: a live record is missing from the index")
      slot = (slot + 1) & mask
    }
    slot
  }

  def insert(hash: Int, a: Long): Unit = {
    if (count == 0 && expectedKeys > mask + 1) resize(slotsFor(expectedKeys)) // the first insert: as expected
    if ((count + 1).toLong * 10 > (mask + 1).toLong * 6) resize(slots.length * 2)
    var slot = home(hash)
    while (slots.address(slot) != 0L) slot = (slot + 1) & mask
    slots.set(slot, a, hash)
    count += 1
  }

  /** Backward-shift deletion: no tombstones in the index, probes stay short. */
  def delete(slot: Int): Unit = {
    var hole = slot
    var j = slot
    slots.setAddress(hole, 0L)
    while (true) {
      j = (j + 1) & mask
      if (slots.address(j) == 0L) { count -= 1; return }
      val h = home(slots.hash(j))
      // Move j into the hole when its home is not in (hole, j] (cyclically).
      val movable = if (hole <= j) h <= hole || h > j else h <= hole && h > j
      if (movable) {
        slots.set(hole, slots.address(j), slots.hash(j))
        slots.setAddress(j, 0L)
        hole = j
      }
    }
  }

  def clear(): Unit = {
    slots = new Slots(InitialSlots, chunkBits); mask = InitialSlots - 1
    count = 0
  }

  private def resize(length: Int): Unit = {
    val old = slots
    slots = new Slots(length, chunkBits)
    mask = length - 1
    var i = 0
    while (i < old.length) {
      if (old.address(i) != 0L) {
        var slot = home(old.hash(i))
        while (slots.address(slot) != 0L) slot = (slot + 1) & mask
        slots.set(slot, old.address(i), old.hash(i))
      }
      i += 1
    }
  }
}

private[engine] object BytesIndex {
  val InitialSlots = 64

  /** Slots (a power of two) for `keys` at a load factor below 0.6. */
  private def slotsFor(keys: Int): Int =
    math.min(1 << 30, Integer.highestOneBit(math.max(InitialSlots, (keys.toLong * 10 / 6).toInt)) * 2)

  /** The index's `length` slots (a power of two), each an address and a hash, in chunks of at
   *  most `1 << bits` slots: none of its arrays is humongous. */
  private final class Slots(val length: Int, bits: Int) {
    private val mask = (1 << bits) - 1
    private val chunkCount = math.max(1, length >>> bits)
    private val addresses = Array.fill(chunkCount)(new Array[Long](math.min(length, 1 << bits)))
    private val hashes = Array.fill(chunkCount)(new Array[Int](math.min(length, 1 << bits)))
    def chunkSlots: Array[Int] = addresses.map(_.length)
    def address(i: Int): Long = addresses(i >>> bits)(i & mask)
    def hash(i: Int): Int = hashes(i >>> bits)(i & mask)
    def setAddress(i: Int, a: Long): Unit = addresses(i >>> bits)(i & mask) = a
    def set(i: Int, a: Long, h: Int): Unit = {
      val c = i >>> bits
      addresses(c)(i & mask) = a
      hashes(c)(i & mask) = h
    }
  }
}
