package io.keyedstate.engine

import com.fasterxml.jackson.databind.JsonNode

/** The settings the state server validated and returned when it opened a store (conf.py). */
final case class StoreSettings(json: JsonNode) {
  def keyGroups: Int = json.get("keyGroups").asInt()
  def snapshotInterval: Int = json.get("snapshotInterval").asInt()
  def snapshotBulkKeys: Long = json.get("snapshotBulkKeys").asLong()
  def scanChunkBytes: Int = json.get("scanChunkBytes").asInt()
  def writeBehind: Boolean = json.get("writeBehind").asBoolean()
  def nearCacheBytes: Long = json.get("nearCacheBytes").asLong()
  def nearCacheWarmKeys: Long = json.get("nearCacheWarmKeys").asLong()
  def bloomFpp: Double = json.get("bloomFpp").asDouble()
  def nativeReads: Boolean = json.get("nativeReads").asBoolean()
  def nativeBlockCacheBytes: Long = json.get("nativeBlockCacheBytes").asLong()
  def memoryBounded: Boolean = json.path("memoryBudget").asLong(0L) > 0
}
