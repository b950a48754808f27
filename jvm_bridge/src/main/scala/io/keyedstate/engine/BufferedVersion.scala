package io.keyedstate.engine

import io.keyedstate.format.{ChangelogFormat, ScanChunk}

/**
 * The version's writes ([[WriteBuffer]], which also logs them) over the committed version
 * ([[CachedReads]]): reads see the version's own writes first. Scans read a point-in-time copy of
 * the buffer, taken when the scan is first read, so callers may remove keys while iterating
 * (watermark eviction does).
 *
 * `committedEmpty`: the committed version holds no key (a new query's first batch, or all state
 * expired or removed). Every key the version has not written yet is then surely absent: reads of
 * it need no lookup, and its first write is logged as new whatever the near cache knows. A new
 * query's first batch can write far more keys than the cache holds, and a Bloom filter started
 * mid-batch is sized for the keys seen by then; without this, most of such a batch's writes
 * would be logged of unknown existence, and the commit would wait for the state server to read
 * every one of them.
 */
final class BufferedVersion(val version: Long, keyGroups: Int, val committed: CachedReads, holdsVersion: () => Boolean,
    cache: BufferedVersion.CacheOwnership, expected: WriteBuffer.Expected = WriteBuffer.Expected.None,
    committedEmpty: Boolean = false) extends KeyValueView {
  val buffer = new WriteBuffer(version + 1, keyGroups, expected)
  /** Whether a write reached the near cache (which then runs ahead of the committed version). */
  @volatile var touchedCache = false
  // The committed key a scan yielded last: Spark's watermark eviction removes what its scan
  // just returned, and the near cache may not hold it (or know it exists) to log the delete.
  private var lastScanned: Array[Byte] = _

  override def get(key: Bytes): Array[Byte] = {
    val pending = buffer.lookup(key)
    if (pending == null) {
      if (committedEmpty) null
      else {
        cache.checkReads(this)
        committed.get(key)
      }
    }
    else if (pending eq WriteBuffer.Tombstone) null
    else pending
  }

  override def put(key: Bytes, value: Array[Byte]): Unit = {
    claim()
    val op = committed.write(key, value)
    buffer.put(key, value, written(key) match {
      case Some(true) => ChangelogFormat.OpPutExisting
      case Some(false) => ChangelogFormat.OpPutNew
      case None => if (committedEmpty) ChangelogFormat.OpPutNew
        else if (op == ChangelogFormat.OpPut && justScanned(key)) ChangelogFormat.OpPutExisting else op
    })
  }

  override def delete(key: Bytes): Unit = {
    claim()
    val op = committed.write(key, WriteBuffer.Tombstone)
    buffer.delete(key, written(key) match {
      case Some(true) => ChangelogFormat.OpDeleteExisting
      case Some(false) => 0.toByte // deleted already in this version: nothing to log
      case None => if (committedEmpty) 0.toByte
        else if (op == ChangelogFormat.OpDelete && justScanned(key)) ChangelogFormat.OpDeleteExisting else op
    })
  }

  /** Before a write into the near cache: this version must be its writer. Asked of the engine on
   *  every write, not once: an invalidation (another version's load, a failed warm or native
   *  sync) clears the writer, and a version that wrote before it lost its writes from the cache
   *  and must not write into the reloaded one, nor claim it again. */
  private def claim(): Unit = if (!cache.isWriter(this)) {
    if (touchedCache) {
      throw new IllegalStateException(s"keyedstate: the store of version $version lost the near cache it wrote " +
        "into (another store of the partition loaded a version meanwhile); this attempt gives way")
    }
    cache.claim(this)
    touchedCache = true
  }

  /** The last scan yielded `key` from the committed version (and the version has not written it
   *  since, or [[written]] would have answered): it exists. */
  private def justScanned(key: Bytes): Boolean = lastScanned != null && java.util.Arrays.equals(lastScanned, key.bytes)

  /** Whether the key exists now, if this version wrote it already (records are sequential). */
  private def written(key: Bytes): Option[Boolean] = buffer.presence(key) match {
    case BytesMap.Missing => None
    case BytesMap.Deleted => Some(false)
    case _ => Some(true)
  }

  /** Lazy: nothing is copied until the iterator is first read. Spark's dropDuplicates asks for
   *  an iterator over all state every batch and, without a watermark, never reads it; the copies
   *  of the version's writes and of a complete near cache would grow with the state. */
  override def scan(prefix: Array[Byte]): Iterator[(Array[Byte], Array[Byte])] =
    new Iterator[(Array[Byte], Array[Byte])] {
      private lazy val entries = scanNow(prefix)
      override def hasNext: Boolean = entries.hasNext
      override def next(): (Array[Byte], Array[Byte]) = entries.next()
    }

  private def scanNow(prefix: Array[Byte]): Iterator[(Array[Byte], Array[Byte])] = {
    cache.checkReads(this)
    val pending = buffer.snapshot()
    val overwritten = new java.util.HashSet[Bytes](pending.length * 2)
    pending.foreach { case (k, _) => overwritten.add(k) }
    // A complete near cache serves full scans locally; prefix scans (one per key in session
    // windows) would walk the whole cache, so they go to RocksDB's sorted index.
    val cached = if (prefix.isEmpty && holdsVersion()) committed.completeSnapshot() else None
    val stored = cached.map(_.iterator).getOrElse(chunks(prefix))
      .filterNot { case (k, _) => overwritten.contains(new Bytes(k)) }
      .map { entry => lastScanned = entry._1; entry }
    val own = pending.iterator.collect {
      case (k, v) if !(v eq WriteBuffer.Tombstone) && Bytes.startsWith(k.bytes, prefix) => (k.bytes, v)
    }
    stored ++ own
  }

  private def chunks(prefix: Array[Byte]): Iterator[(Array[Byte], Array[Byte])] = new Iterator[(Array[Byte], Array[Byte])] {
    private var chunk: ScanChunk = committed.scan(prefix, null, keysOnly = false)
    private var i = 0
    override def hasNext: Boolean = {
      while (i >= chunk.keys.length && chunk.hasMore) {
        chunk = committed.scan(prefix, chunk.keys(chunk.keys.length - 1), keysOnly = false)
        i = 0
      }
      i < chunk.keys.length
    }
    override def next(): (Array[Byte], Array[Byte]) = {
      if (!hasNext) throw new NoSuchElementException
      val e = (chunk.keys(i), chunk.values(i))
      i += 1
      e
    }
  }
}

object BufferedVersion {
  /** The engine's near cache, which one open version at a time writes into (its writes run
   *  ahead of the committed version there): the other versions open at once (a zombie or
   *  duplicate attempt of the partition in the same JVM) may neither write nor read it. */
  trait CacheOwnership {
    /** Whether `v` is the cache's writer now (a volatile read: asked on every write). */
    def isWriter(v: BufferedVersion): Boolean
    /** Makes `v` the writer, or fails it: another version writes, or the engine moved on. */
    def claim(v: BufferedVersion): Unit
    /** Fails a read of `v` while another version writes into the cache. */
    def checkReads(v: BufferedVersion): Unit
  }
}
