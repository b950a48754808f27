package io.keyedstate.engine

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.slf4j.LoggerFactory

import io.keyedstate.format.KeyCodec

/**
 * The time to live of one store's entries (Flink's StateTtlConfig, set by Spark confs), and the
 * rules that follow from it. Applied to a version's reads and writes by [[TtlView]]; cleanup is
 * [[TtlCleanup]]; "now" comes from an injected [[TtlClock]].
 *
 * Per-entry stores keep the time of an entry's last write (or read, with `updateOnRead`) in its
 * value ([[KeyCodec]] value format 2); the entry is expired once `now - ttlMs` has reached it. A
 * stream-stream join's `keyWithIndexToValue` store has no expiry of its own: Spark reads its rows
 * only through the count in the sibling `keyToNumValues` store, so a row lives exactly as long as
 * its join key's count (`countStore`), and an index the count no longer covers is garbage for
 * cleanup. Expiring rows one by one would leave counts pointing at missing rows.
 */
final case class TtlPolicy(
    ttlMs: Long,
    updateOnRead: Boolean,
    returnExpired: Boolean,
    countStore: Option[String],
    cleanupInterval: Int,
    cleanupKeysPerScan: Int) {
  def enabled: Boolean = ttlMs > 0
  /** Entries carry their own timestamp and expire one by one. */
  def perEntry: Boolean = enabled && countStore.isEmpty

  /** Entries written at or before this time are expired at `nowMs`. */
  def expireBefore(nowMs: Long): Long = if (perEntry) nowMs - ttlMs else Long.MinValue

  /** Whether a stored value, last written at its recorded time, is expired (plain values never are). */
  def isExpired(stored: Array[Byte], expireBefore: Long): Boolean =
    stored(0) == KeyCodec.TimedValue && KeyCodec.writtenAt(stored) <= expireBefore

  /** Whether a read at `nowMs` refreshes the entry (OnReadAndWrite), i.e. writes it again. */
  def refreshesOnRead(stored: Array[Byte], nowMs: Long): Boolean =
    perEntry && updateOnRead && stored(0) == KeyCodec.TimedValue && KeyCodec.writtenAt(stored) != nowMs

  def describe: java.util.Map[String, AnyRef] = {
    val out = new java.util.LinkedHashMap[String, AnyRef]()
    out.put("ttlMs", Long.box(ttlMs))
    out.put("updateType", if (updateOnRead) "OnReadAndWrite" else "OnCreateAndWrite")
    out.put("visibility", if (returnExpired) "ReturnExpiredIfNotCleanedUp" else "NeverReturnExpired")
    out.put("expiresWith", countStore.getOrElse("itself"))
    out
  }
}

object TtlPolicy {
  val IndexStoreSuffix = "keyWithIndexToValue"
  val CountStoreSuffix = "keyToNumValues"
  val Off: TtlPolicy = TtlPolicy(0, updateOnRead = false, returnExpired = false, None, 0, 0)

  /** The policy of store `id` from the settings the Python server validated (conf.py). */
  def resolve(settings: JsonNode, id: StateStoreId): TtlPolicy = {
    val overrides = settings.get("ttlOverrides")
    def ttlOf(store: String): Long = {
      val seconds = Option(overrides.get(s"${id.operatorId}.$store"))
        .orElse(Option(overrides.get(id.operatorId.toString)))
        .getOrElse(settings.get("ttl"))
        .asDouble()
      math.round(seconds * 1000)
    }
    val countStore =
      if (id.storeName.endsWith(IndexStoreSuffix)) Some(id.storeName.stripSuffix(IndexStoreSuffix) + CountStoreSuffix)
      else None
    TtlPolicy(
      ttlMs = ttlOf(countStore.getOrElse(id.storeName)),
      updateOnRead = settings.get("ttl.updateType").asText() == "OnReadAndWrite",
      returnExpired = settings.get("ttl.visibility").asText() == "ReturnExpiredIfNotCleanedUp",
      countStore = countStore,
      cleanupInterval = settings.get("ttl.cleanupInterval").asInt(),
      cleanupKeysPerScan = settings.get("ttl.cleanupKeysPerScan").asInt())
  }

  private val validated = java.util.concurrent.ConcurrentHashMap.newKeySet[String]()

  /**
   * Fails when a per-operator override names an operator or store the query does not have.
   * The driver writes every stateful operator's metadata (`state/<opId>/_metadata/metadata`)
   * while planning the first batch of a run, before any task, so the first stateful task
   * fails and the query stops at its start.
   */
  def validateOverrides(settings: JsonNode, id: StateStoreId, hadoopConf: Configuration, confPrefix: String): Unit = {
    val overrides = settings.get("ttlOverrides").fieldNames().asScala.toSeq.sorted
    val key = s"${id.checkpointRootLocation}|${overrides.mkString(",")}"
    if (overrides.isEmpty || !validated.add(key)) return
    try {
      val operators = SparkMetadata.operators(new Path(id.checkpointRootLocation), hadoopConf)
      if (operators.isEmpty) {
        log.warn(s"keyedstate: no operator metadata under ${id.checkpointRootLocation}; cannot check the " +
          s"operator ids of ${overrides.map(confPrefix + "ttl." + _).mkString(", ")}")
        return
      }
      val allowed = operators.toSeq.sortBy(_._1).map { case (op, (name, stores)) =>
        s"$op ($name: ${stores.filterNot(_.endsWith(IndexStoreSuffix)).mkString(", ")})"
      }.mkString("; ")
      overrides.foreach { key =>
        val (op, store) = key.split("\\.", 2) match {
          case Array(o, s) => (o.toInt, Some(s))
          case Array(o) => (o.toInt, None)
        }
        val problem = operators.get(op) match {
          case None => Some(s"this query has no stateful operator $op")
          case Some((_, stores)) => store match {
            case Some(s) if s.endsWith(IndexStoreSuffix) =>
              Some(s"rows of '$s' expire with their join key's count; set the TTL of " +
                s"'${s.stripSuffix(IndexStoreSuffix) + CountStoreSuffix}' instead")
            case Some(s) if !stores.contains(s) => Some(s"operator $op has no store '$s'")
            case _ => None
          }
        }
        problem.foreach { why =>
          throw new IllegalArgumentException(
            s"Invalid conf '${confPrefix}ttl.$key': $why. Allowed: ${confPrefix}ttl.<operatorId> or " +
              s"ttl.<operatorId>.<storeName> for the stateful operators of this query: $allowed")
        }
      }
    } catch {
      case e: Throwable => validated.remove(key); throw e
    }
  }

  private val log = LoggerFactory.getLogger(classOf[TtlPolicy])
}
