package io.keyedstate.engine

import java.nio.file.{Files, Path}
import java.util.concurrent.locks.ReentrantReadWriteLock

import org.rocksdb.{BlockBasedTableConfig, BloomFilter, InfoLogLevel, LRUCache, Options, RocksDB}

import io.keyedstate.bridge.LocalFiles
import io.keyedstate.format.ScanChunk

/**
 * Reads one store's Python-owned RocksDB directly, as a RocksDB secondary instance (Spark's
 * bundled rocksdbjni), so that a near-cache miss costs a JNI call of a few microseconds instead
 * of a round trip to the Python server, which a batch may need millions of. Python stays the
 * only writer.
 *
 * Version discipline: the instance shows what Python had flushed when it last caught up. The
 * [[StoreEngine]] calls [[follow]] once per loaded version, after Python confirmed (the sync op)
 * that the version is applied and flushed (its WAL is off: only flushed data is visible), and it
 * never commits the next version before its reads of this one are done; it alone tracks which
 * version that is. `max_open_files=-1`
 * keeps every file of the followed version open, so Python's compactions cannot pull a file
 * from under a read.
 */
final class NativeReader(secondaryDir: Path) extends AutoCloseable {
  private val lock = new ReentrantReadWriteLock()
  private var db: RocksDB = _
  private var options: Options = _
  private var primaryDir: String = _
  @volatile private var following = false

  /** Show what Python holds applied and flushed in `dir`: open there, or catch up. */
  def follow(dir: String): Unit = {
    lock.writeLock().lock()
    try {
      following = false
      if (db != null && dir == primaryDir) db.tryCatchUpWithPrimary()
      else {
        closeDb()
        LocalFiles.createPrivateDirectories(secondaryDir) // 0700 like every directory keyedstate makes
        options = NativeReader.newOptions()
        db = RocksDB.openAsSecondary(options, dir, secondaryDir.toString)
        primaryDir = dir
      }
      following = true
    } finally lock.writeLock().unlock()
  }

  /** The stored value of `key` in the followed version; null when absent. */
  def get(key: Array[Byte]): Array[Byte] = read(db.get(key))

  /** Entries with `prefix` after `startAfter` (null = from the start), as the Python scan op
   *  returns them: about `maxBytes`, plus whether more remain. */
  def scan(prefix: Array[Byte], startAfter: Array[Byte], maxBytes: Int, keysOnly: Boolean): ScanChunk = read {
    val keys = Array.newBuilder[Array[Byte]]
    val values = Array.newBuilder[Array[Byte]]
    val it = db.newIterator()
    try {
      if (startAfter == null) it.seek(prefix)
      else {
        it.seek(startAfter)
        if (it.isValid && java.util.Arrays.equals(it.key(), startAfter)) it.next()
      }
      var size = 0L
      var more = false
      var done = false
      while (!done && it.isValid) {
        val key = it.key()
        if (!Bytes.startsWith(key, prefix)) done = true
        else if (size >= maxBytes && size > 0) { more = true; done = true } // a chunk is never empty
        else {
          val value = if (keysOnly) Array.emptyByteArray else it.value()
          keys += key
          values += value
          size += key.length + value.length + 8
          it.next()
        }
      }
      it.status()
      ScanChunk(keys.result(), values.result(), more)
    } finally it.close()
  }

  private def read[T](f: => T): T = {
    lock.readLock().lock()
    try {
      if (db == null || !following) throw new IllegalStateException("keyedstate: native reader follows no version")
      f
    } finally lock.readLock().unlock()
  }

  /** Stop showing any version (before Python replaces the directory, or on failure). */
  def reset(): Unit = {
    lock.writeLock().lock()
    try { following = false; closeDb() } finally lock.writeLock().unlock()
  }

  private def closeDb(): Unit = {
    if (db != null) db.close()
    if (options != null) options.close()
    db = null
    options = null
    primaryDir = null
  }

  override def close(): Unit = {
    reset()
    LocalFiles.deleteTree(secondaryDir)
  }
}

object NativeReader {
  RocksDB.loadLibrary()

  @volatile private var cacheBytes = 64L << 20

  @volatile private var bounded = false

  /** Sizes the block cache; the first store opened in this executor decides (like the near
   *  cache's budget), since the cache is created once. `bounded` (a memoryBudget is set): index
   *  and filter blocks live in that cache too, as in Spark's RocksDB provider with
   *  boundedMemoryUsage, instead of in each open file's reader, where they grow with the state
   *  (the Bloom filters alone about 1.25 bytes a key, the index blocks more) outside any bound. */
  def configure(blockCacheBytes: Long, bounded: Boolean): Unit = {
    if (blockCacheBytes > 0) cacheBytes = blockCacheBytes
    this.bounded = bounded
  }

  /** One block cache for every store of this executor: Python's files are in the OS page
   *  cache anyway, but a miss here costs a block decompression (~10 us with LZ4). */
  @volatile private var cacheCreated = false
  private lazy val blockCache = { cacheCreated = true; new LRUCache(cacheBytes) }

  /** Bytes in the block cache (0 before any store read natively). */
  def cacheUsage: Long = if (cacheCreated) blockCache.getUsage else 0L

  /** RocksDB's warnings go to the executor's log: no LOG file of RocksDB's own, which it would
   *  create with the JVM's umask (readable by others) rather than private. */
  private lazy val rocksLog = new org.rocksdb.Logger(InfoLogLevel.WARN_LEVEL) {
    override protected def log(level: InfoLogLevel, message: String): Unit =
      NativeReader.log.warn(s"keyedstate: native reader (RocksDB): $message")
  }
  private val log = org.slf4j.LoggerFactory.getLogger(classOf[NativeReader])

  /** The filter policy Python's files are written with (formats/rocksdb.py: 10 bits a key, full
   *  filters). A reader without one ignores the files' filters: every read of an absent key
   *  then searches a data block in each file that may hold it (measured on 1.25M keys: 6.7-7.5
   *  us a read, 3.3-3.8 us with it). Shared: the policy holds no state of its own. */
  private lazy val bloomFilter = new BloomFilter(10, false)

  private def newOptions(): Options = {
    val table = new BlockBasedTableConfig().setBlockCache(blockCache).setFilterPolicy(bloomFilter)
    if (bounded) table.setCacheIndexAndFilterBlocks(true).setPinL0FilterAndIndexBlocksInCache(true)
    new Options()
      .setMaxOpenFiles(-1) // required for a secondary: files stay readable after Python deletes them
      .setInfoLogLevel(InfoLogLevel.WARN_LEVEL)
      .setLogger(rocksLog)
      .setTableFormatConfig(table)
  }
}
