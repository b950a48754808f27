package io.keyedstate.engine

/** One version of the store, open for one task: its view (TTL over the version's own writes
 *  over the committed version) and the TTL "now" of its batch. */
final class StoreVersion(val version: Long, val uniqueId: Option[String], val buffered: BufferedVersion,
    val ttl: TtlView, val nowMs: Long, val fromEmpty: Boolean) {
  def view: KeyValueView = ttl
}
