package io.keyedstate.engine

import java.util.concurrent.ConcurrentHashMap

import org.apache.spark.sql.execution.streaming.state.StateStoreId

/** The engines open in this JVM, so that a join's index store can consult its count store. */
object OpenStores {
  private val open = new ConcurrentHashMap[StateStoreId, StoreEngine]()

  def register(id: StateStoreId, engine: StoreEngine): Unit = open.put(id, engine)
  def unregister(id: StateStoreId, engine: StoreEngine): Unit = open.remove(id, engine)
  def get(id: StateStoreId): Option[StoreEngine] = Option(open.get(id))
}
