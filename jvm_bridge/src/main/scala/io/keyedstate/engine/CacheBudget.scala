package io.keyedstate.engine

import java.util.concurrent.atomic.AtomicLong

/**
 * Near-cache memory shared by every store of this executor JVM: entries (with their object
 * overhead) and Bloom filters. Each store that opens sets the limit from its `nearCacheBytes`
 * (`auto` = 30% of the JVM's max heap, or its share of `memoryBudget`); the stores of one query
 * share their confs, so in practice one value applies. Caches evict as they next insert, and
 * after a commit (when an overlay grew).
 */
object CacheBudget {
  private val used = new AtomicLong
  private val overlays = new AtomicLong
  @volatile private var limit = Long.MaxValue

  def configure(bytes: Long): Unit =
    limit = if (bytes >= 0) bytes else (Runtime.getRuntime.maxMemory * 0.3).toLong
  def limitBytes: Long = limit
  def usedBytes: Long = used.get
  def add(delta: Long): Long = used.addAndGet(delta)
  def over: Boolean = used.get > limit

  /** Native readers' overlays ([[NativeSync]]) are charged here too, and together they may take
   *  at most half of the limit, so that the caches can always evict enough to hold it. */
  def addOverlay(delta: Long): Unit = { overlays.addAndGet(delta); used.addAndGet(delta) }
  def overlaysFit(extra: Long): Boolean = overlays.get + extra <= limit / 2
}
