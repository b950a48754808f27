package io.keyedstate.engine

import java.util.Arrays

import scala.collection.mutable.ArrayBuffer

/**
 * A hash map from byte-string keys to byte-string values that keeps its entries in pages of a
 * byte arena, not in objects: a record is `[flags:1][keyLen:4][valueLen:4][key][value]` in a
 * page, and the index is primitive arrays (open addressing, linear probing) of record
 * addresses and key hashes, in chunks.
 *
 * Why: the near cache and the write buffer hold millions of entries that live for seconds to
 * minutes. As `HashMap` entries (a node, a key wrapper and two arrays each) they survive young
 * collections, get copied and promoted, and die in the old generation, so G1 grows the heap to
 * keep up, to many times the live bytes. Here an entry costs ~9
 * bytes of header and ~20 of index, a batch's writes fill a few hundred pages, and an update
 * to a value of the same length is written in place.
 *
 * Records are appended to the newest page; pages leave oldest first ([[dropOldestPage]], the
 * near cache's eviction, with a second chance for records read since they were written) or all
 * at once when garbage outweighs live data ([[compact]]). Lookups return copies. Not
 * thread-safe: each instance belongs to one store's task thread.
 *
 * `pageBytes` chooses each new page's size from the room it is given, so that small budgets get
 * small pages; pages stay below half of G1's smallest region (512 KiB) so they are never
 * humongous. So do the index's arrays ([[BytesIndex]]): as two flat arrays, a 250k-key map's index
 * was two humongous objects taking three 4 MiB regions for 6 MiB.
 */
final class BytesMap(pageBytes: () => Int, expectedKeys: Int = 0, chunkBits: Int = BytesMap.ChunkBits) {
  import BytesMap._
  require(chunkBits >= 0 && chunkBits <= ChunkBits,
    s"keyedstate: index chunks of 2^$chunkBits slots; at most 2^$ChunkBits, under G1's humongous size")

  /** Pages of one size (tests; `chunkBits` small, so that a few keys span many index chunks). */
  def this(pageSize: Int, expectedKeys: Int, chunkBits: Int) = this(() => pageSize, expectedKeys, chunkBits)
  def this(pageSize: Int, expectedKeys: Int) = this(() => pageSize, expectedKeys)
  def this(pageSize: Int) = this(() => pageSize, 0)

  // Index: addresses (0 = empty) and the keys' hashes.
  private val index = new BytesIndex(chunkBits, expectedKeys)

  // Pages, oldest first; page ids grow forever, `firstPage` is the id of `pages(0)`.
  private val pages = ArrayBuffer.empty[Array[Byte]]
  private var pageLive = new Array[Int](16) // live record bytes per page, as `pages` (unboxed)
  private var firstPage = 1
  private var used = 0 // bytes used in the newest page
  private var pageTotal = 0L
  private var liveTotal = 0L

  def size: Int = index.size
  /** Heap held: pages and index (0 when empty: an emptied map's small index is not counted, so a
   *  cleared cache that is dropped leaves nothing charged to the budget). */
  def memoryBytes: Long =
    if (index.size == 0 && pages.isEmpty && index.length == BytesIndex.InitialSlots) 0L else pageTotal + index.length.toLong * 12
  /** Bytes of records that are live (headers included). */
  def liveBytes: Long = liveTotal
  def pageCount: Int = pages.size
  /** Slots of each chunk of the index (tests: none may be a humongous array). */
  def indexChunkSlots: Array[Int] = index.chunkSlots

  /** Whether `key` is here: [[Missing]], [[Deleted]] (a tombstone) or [[Present]]; no copy. */
  def presence(key: Array[Byte], hash: Int): Int = {
    val slot = find(key, hash)
    if (slot < 0) Missing
    else {
      val a = index.address(slot)
      if ((pageOf(a)(offsetOf(a)) & Tombstone) != 0) Deleted else Present
    }
  }

  /** A copy of the value of `key`, or null; marks the record as read (see [[dropOldestPage]]). */
  def get(key: Array[Byte], hash: Int): Array[Byte] = {
    val slot = find(key, hash)
    if (slot < 0) null
    else {
      val a = index.address(slot)
      val page = pageOf(a)
      val off = offsetOf(a)
      page(off) = (page(off) | Referenced).toByte
      valueAt(page, off)
    }
  }

  /**
   * Sets `key` to `value` ([[TombstoneValue]], by identity, records a delete for the write
   * buffer); returns whether the key was there. A value of the same length is overwritten in
   * place; any other leaves the old record dead in its page (reclaimed by [[compact]]).
   */
  def put(key: Array[Byte], hash: Int, value: Array[Byte]): Boolean = {
    val tomb = value eq TombstoneValue
    val slot = find(key, hash)
    if (slot >= 0) {
      val a = index.address(slot)
      val page = pageOf(a)
      val off = offsetOf(a)
      val vl = readInt(page, off + 5)
      if (vl == value.length) { // same length: in place
        System.arraycopy(value, 0, page, off + Header + key.length, vl)
        page(off) = ((if (tomb) Tombstone else 0) | (page(off) & Referenced)).toByte
        return true
      }
      kill(a)
      index.setAddress(slot, append(key, value, tomb))
      true
    } else {
      index.insert(hash, append(key, value, tomb))
      false
    }
  }

  /** Removes `key`; returns whether it was there. */
  def remove(key: Array[Byte], hash: Int): Boolean = {
    val slot = find(key, hash)
    if (slot < 0) false
    else {
      kill(index.address(slot))
      index.delete(slot)
      true
    }
  }

  /** Every live record in page order (oldest first), as copies. */
  def foreach(f: (Array[Byte], Array[Byte]) => Unit): Unit = foreachRecord { (page, off) =>
    f(Arrays.copyOfRange(page, off + Header, off + Header + readInt(page, off + 1)), valueAt(page, off))
  }

  /** The hash of every key in the index (tombstones' too), in slot order: what a filter over
   *  the keys needs, without reading a page. */
  def foreachHash(f: Int => Unit): Unit = index.foreachHash(f)

  /** Every live record in page order, as copies. */
  def toArray: Array[(Array[Byte], Array[Byte])] = {
    val out = new Array[(Array[Byte], Array[Byte])](index.size)
    var i = 0
    foreach { (k, v) => out(i) = (k, v); i += 1 }
    out
  }

  /**
   * Drops the oldest page (the newest too, when it is the only one): its records leave the map,
   * except those read since they were written or last moved, which move to the newest page
   * once (a second chance, so that hot keys survive a FIFO eviction). Returns the number of
   * records dropped.
   */
  def dropOldestPage(): Int = {
    if (pages.isEmpty) return 0
    val only = pages.size == 1
    val page = pages(0)
    val pageId = firstPage
    var dropped = 0
    liveRecords(page, if (only) used else page.length) { off =>
      val kl = readInt(page, off + 1)
      val vl = readInt(page, off + 5)
      val flags = page(off)
      val slot = index.slotOfAddress(address(pageId, off), Bytes.hashOf(page, off + Header, kl))
      page(off) = (flags | Dead).toByte
      if ((flags & Referenced) != 0 && !only) {
        val key = Arrays.copyOfRange(page, off + Header, off + Header + kl)
        val value = Arrays.copyOfRange(page, off + Header + kl, off + Header + kl + vl)
        index.setAddress(slot, append(key, value, (flags & Tombstone) != 0))
      } else {
        index.delete(slot)
        dropped += 1
      }
    }
    pageTotal -= page.length
    liveTotal -= pageLive(0)
    pages.remove(0)
    System.arraycopy(pageLive, 1, pageLive, 0, pages.size)
    firstPage += 1
    if (pages.isEmpty) used = 0
    dropped
  }

  /** True when dead records outweigh live ones by more than a page's worth: worth a [[compact]]. */
  def wasteful: Boolean = pageTotal - liveTotal > math.max(liveTotal, MaxPage.toLong)

  /** Rewrites every live record into fresh pages (in order) and drops the old pages. */
  def compact(): Unit = {
    val oldPages = pages.toArray
    val oldFirst = firstPage
    val oldUsed = used
    pages.clear()
    firstPage = oldFirst + oldPages.length
    used = 0; pageTotal = 0; liveTotal = 0
    var i = 0
    while (i < oldPages.length) {
      val page = oldPages(i)
      val pageId = oldFirst + i
      liveRecords(page, if (i == oldPages.length - 1) oldUsed else page.length) { off =>
        val kl = readInt(page, off + 1)
        val slot = index.slotOfAddress(address(pageId, off), Bytes.hashOf(page, off + Header, kl))
        index.setAddress(slot, appendRaw(page, off, recordLength(page, off)))
      }
      i += 1
    }
  }

  def clear(): Unit = {
    index.clear()
    firstPage += pages.size
    pages.clear()
    used = 0; pageTotal = 0; liveTotal = 0
  }

  // -- records ----------------------------------------------------------------------------------
  private def pageOf(a: Long): Array[Byte] = pages((a >>> 32).toInt - firstPage)

  /** A copy of the value of the record at `off` ([[TombstoneValue]] for a delete). */
  private def valueAt(page: Array[Byte], off: Int): Array[Byte] =
    if ((page(off) & Tombstone) != 0) TombstoneValue
    else {
      val from = off + Header + readInt(page, off + 1)
      Arrays.copyOfRange(page, from, from + readInt(page, off + 5))
    }
  private def offsetOf(a: Long): Int = a.toInt

  private def append(key: Array[Byte], value: Array[Byte], tomb: Boolean): Long = {
    val len = Header + key.length + value.length
    val a = reserve(len)
    val page = pageOf(a)
    val off = offsetOf(a)
    page(off) = (if (tomb) Tombstone else 0).toByte
    writeInt(page, off + 1, key.length)
    writeInt(page, off + 5, value.length)
    System.arraycopy(key, 0, page, off + Header, key.length)
    System.arraycopy(value, 0, page, off + Header + key.length, value.length)
    a
  }

  private def appendRaw(from: Array[Byte], at: Int, len: Int): Long = {
    val a = reserve(len)
    System.arraycopy(from, at, pageOf(a), offsetOf(a), len)
    pageOf(a)(offsetOf(a)) = (from(at) & ~Referenced).toByte
    a
  }

  /** Room for a record of `len` bytes at the end of the newest page, or in a new one. */
  private def reserve(len: Int): Long = {
    if (pages.isEmpty || used + len > pages.last.length) {
      if (pages.nonEmpty && used + 1 <= pages.last.length) pages.last(used) = Padding // end of records
      val size = math.max(len, math.min(MaxPage, math.max(MinPage, pageBytes())))
      pages += new Array[Byte](size)
      if (pageLive.length < pages.size) pageLive = Arrays.copyOf(pageLive, pageLive.length * 2)
      pageLive(pages.size - 1) = 0
      pageTotal += size
      used = 0
    }
    val off = used
    used += len
    pageLive(pages.size - 1) += len
    liveTotal += len
    address(firstPage + pages.size - 1, off)
  }

  /** Marks the record at `a` dead (replaced or removed); its bytes are garbage until its page goes. */
  private def kill(a: Long): Unit = {
    val page = pageOf(a)
    val off = offsetOf(a)
    page(off) = (page(off) | Dead).toByte
    val len = recordLength(page, off)
    pageLive((a >>> 32).toInt - firstPage) -= len
    liveTotal -= len
  }

  private def foreachRecord(f: (Array[Byte], Int) => Unit): Unit = {
    var i = 0
    while (i < pages.size) {
      val page = pages(i)
      liveRecords(page, if (i == pages.size - 1) used else page.length)(off => f(page, off))
      i += 1
    }
  }

  /** Calls `f` with the offset of each live record of `page`, whose records end at `end` or at
   *  a padding byte; `f` may mark the record dead (lengths are read before). */
  private def liveRecords(page: Array[Byte], end: Int)(f: Int => Unit): Unit = {
    var off = 0
    while (off < end && off + Header <= page.length && !isPadding(page, off)) {
      val len = recordLength(page, off)
      if ((page(off) & Dead) == 0) f(off)
      off += len
    }
  }

  // -- index ------------------------------------------------------------------------------------
  private def find(key: Array[Byte], hash: Int): Int = {
    var slot = index.home(hash)
    while (true) {
      val a = index.address(slot)
      if (a == 0L) return -1
      if (index.hash(slot) == hash) {
        val page = pageOf(a)
        val off = offsetOf(a)
        if (readInt(page, off + 1) == key.length &&
          Arrays.equals(page, off + Header, off + Header + key.length, key, 0, key.length)) return slot
      }
      slot = index.next(slot)
    }
    -1
  }
}

object BytesMap {
  /** Returned by [[BytesMap.get]] for a delete recorded by the write buffer; by identity. */
  val TombstoneValue: Array[Byte] = WriteBuffer.Tombstone
  val Header = 9
  val MinPage = 1024
  /** Below half of G1's smallest region (1 MiB), so pages are never humongous. */
  val MaxPage: Int = 256 * 1024 - 64
  val Missing = 0
  val Deleted = 1
  val Present = 2
  private val Dead = 1
  private val Referenced = 2
  private val Tombstone = 4
  private val Padding: Byte = -1 // flags byte that ends a page's records early

  private def isPadding(page: Array[Byte], off: Int): Boolean = page(off) == Padding
  private def recordLength(page: Array[Byte], off: Int): Int = Header + readInt(page, off + 1) + readInt(page, off + 5)
  private def address(pageId: Int, off: Int): Long = (pageId.toLong << 32) | (off.toLong & 0xffffffffL)

  /** Index slots per chunk: 32,768, 256 KiB of addresses, below half of G1's smallest region. */
  final val ChunkBits = 15

  private def readInt(a: Array[Byte], i: Int): Int =
    (a(i) & 0xff) << 24 | (a(i + 1) & 0xff) << 16 | (a(i + 2) & 0xff) << 8 | (a(i + 3) & 0xff)
  private def writeInt(a: Array[Byte], i: Int, v: Int): Unit = {
    a(i) = (v >>> 24).toByte; a(i + 1) = (v >>> 16).toByte; a(i + 2) = (v >>> 8).toByte; a(i + 3) = v.toByte
  }
}
