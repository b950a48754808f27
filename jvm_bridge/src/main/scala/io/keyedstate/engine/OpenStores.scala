package io.keyedstate.engine

import java.util.concurrent.ConcurrentHashMap

import org.apache.spark.sql.execution.streaming.state.StateStoreId

/**
 * The engines open in this JVM, so that a join's index store can consult its count store. Keyed
 * by store and query run: a state data source reader of the same store, or a stopped run's
 * provider that Spark has not closed yet, has its own entry and can neither replace nor remove
 * the running query's.
 */
object OpenStores {
  private val open = new ConcurrentHashMap[(StateStoreId, Option[String]), StoreEngine]()

  def register(engine: StoreEngine): Unit = open.put((engine.id, engine.fence.runId), engine)
  def unregister(engine: StoreEngine): Unit = open.remove((engine.id, engine.fence.runId), engine)
  def count: Int = open.size

  @volatile private var serverBytes = (0L, -1L) // (when read, ns; bytes, -1 = never): read at most twice a second

  /** What keyedstate holds in memory in this executor, all parts of `memoryBudget`, divided over
   *  the open stores: summed over a query's stores (as Spark sums metrics) it is the total. The
   *  servers' part is one call per server, shared by the stores that report within 500 ms. */
  def memoryBytesPerStore(): Long = {
    val (at, bytes) = serverBytes
    val servers = if (bytes >= 0 && System.nanoTime() - at < 500000000L) bytes else {
      val now = io.keyedstate.bridge.StateServerProcess.processMemoryBytes()
      serverBytes = (System.nanoTime(), now)
      now
    }
    (CacheBudget.usedBytes + NativeReader.cacheUsage + servers) / math.max(1, count)
  }
  /** The engine of store `id` of the same run as `of`. */
  def sibling(of: StoreEngine, id: StateStoreId): Option[StoreEngine] = Option(open.get((id, of.fence.runId)))
}
