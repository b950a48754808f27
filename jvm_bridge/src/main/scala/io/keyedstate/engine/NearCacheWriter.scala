package io.keyedstate.engine

/**
 * Which open version writes into the engine's near cache (each write as it happens), one at a
 * time: a second version open at once (a zombie or duplicate attempt of the partition in this
 * JVM) may neither write nor read the cache, and fails instead of mixing its writes in. A claim
 * holds `lock` (the engine's monitor), under which the engine moves the version it holds.
 */
private[engine] final class NearCacheWriter(lock: AnyRef, describe: String, loaded: () => Long)
    extends BufferedVersion.CacheOwnership {
  @volatile private var writer: BufferedVersion = _

  /** The version writing now, or null. */
  def current: BufferedVersion = writer

  override def isWriter(v: BufferedVersion): Boolean = writer eq v

  /** Makes `v` the version that writes into the near cache. */
  override def claim(v: BufferedVersion): Unit = lock.synchronized {
    if (writer != null && !(writer eq v)) {
      throw new IllegalStateException(s"keyedstate: two stores of $describe write at once (versions " +
        s"${writer.version} and ${v.version}); this attempt gives way")
    }
    val held = loaded()
    if (held != v.version) {
      throw new IllegalStateException(s"keyedstate: $describe holds version $held, cannot write on top of version " +
        s"${v.version} (two stores of one partition were open at once)")
    }
    writer = v
  }

  /** Another open version's writes run ahead of the committed version in the cache. Spark's
   *  RocksDB provider makes the second attempt wait for the first one's lock; here it gives
   *  way, as it does at its first write. */
  override def checkReads(v: BufferedVersion): Unit = {
    val w = writer
    if (w != null && !(w eq v)) {
      throw new IllegalStateException(s"keyedstate: two stores of $describe open at once: version ${w.version}'s " +
        "writes are in the near cache and not committed, and this attempt's reads would see them; this attempt gives way")
    }
  }

  /** `v` no longer writes into the cache (if it did). */
  def release(v: BufferedVersion): Unit = if (writer eq v) writer = null

  /** No version writes into the cache (the engine forgot the version it held). */
  def clear(): Unit = writer = null
}
