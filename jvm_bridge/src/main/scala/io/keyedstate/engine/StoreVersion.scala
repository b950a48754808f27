package io.keyedstate.engine

/** One version of the store, open for one task: its view (TTL over the version's own writes
 *  over the committed version), the TTL "now" of its batch, and the unique id its commit gives
 *  the next version (checkpoint format 2), drawn now so that its changelog can open early. */
final class StoreVersion(val version: Long, val uniqueId: Option[String], val buffered: BufferedVersion,
    val ttl: TtlView, val nowMs: Long, val fromEmpty: Boolean, val nextId: Option[String]) {
  def view: KeyValueView = ttl
  // The next version's changelog, opening ahead of the commit (StoreEngine.prepareCommit); under
  // the engine's lock, taken by the commit or cancelled once.
  private[engine] var opening: Option[CommitWrites.Opening] = None
}
