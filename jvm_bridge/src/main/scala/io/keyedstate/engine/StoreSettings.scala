package io.keyedstate.engine

import com.fasterxml.jackson.databind.JsonNode

/** The settings the state server validated and returned when it opened a store (conf.py). */
final case class StoreSettings(json: JsonNode) {
  def keyGroups: Int = json.get("keyGroups").asInt()
  def snapshotInterval: Int = json.get("snapshotInterval").asInt()
  def snapshotBulkKeys: Long = json.get("snapshotBulkKeys").asLong()
  def scanChunkBytes: Int = json.get("scanChunkBytes").asInt()
  def writeBehind: Boolean = json.get("writeBehind").asBoolean()
  def changelogSync: Boolean = json.get("changelogSync").asBoolean()
  def nearCacheBytes: Long = json.get("nearCacheBytes").asLong()
  def nearCacheWarmKeys: Long = json.get("nearCacheWarmKeys").asLong()
  def bloomFpp: Double = json.get("bloomFpp").asDouble()
  def nativeReads: Boolean = json.get("nativeReads").asBoolean()
  def nativeBlockCacheBytes: Long = json.get("nativeBlockCacheBytes").asLong()
  def nativeOverlayBytes: Long = json.get("nativeOverlayBytes").asLong()
  def memoryBounded: Boolean = json.path("memoryBudget").asLong(0L) > 0

  /** Whether a version that added `added` keys, leaving `keys`, was a bulk load (a first batch
   *  over a backlog, a catch-up that brings new keys): at least snapshotBulkKeys keys added, at
   *  least as many as were there before. The server stages such a version's snapshot right after
   *  its apply (server/store.py's `_bulk`, the same rule, on the same exact counts) and the commit
   *  asks for its upload at once, so that a load after a stop does not replay it. */
  def bulkLoad(added: Long, keys: Long): Boolean = {
    val least = snapshotBulkKeys
    least > 0 && added >= least && added >= keys - added
  }
}
