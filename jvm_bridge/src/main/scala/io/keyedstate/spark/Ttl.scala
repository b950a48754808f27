package io.keyedstate.spark

import java.nio.charset.StandardCharsets
import java.nio.file.{Files, Paths}
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.JsonNode
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.hadoop.io.IOUtils
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.slf4j.LoggerFactory

/**
 * The time to live of one store's entries (Flink's StateTtlConfig, set by Spark confs).
 *
 * Per-entry stores keep the time of an entry's last write (or read, with `updateOnRead`) in
 * its value (KeyCodec format 2); the entry is expired once `now - ttlMs` has reached it. A
 * stream-stream join's `keyWithIndexToValue` store has no expiry of its own: Spark reads its
 * rows only through the count in the sibling `keyToNumValues` store, so a row lives exactly
 * as long as its join key's count (`countStore`), and an index the count no longer covers is
 * garbage for cleanup. Expiring rows one by one would leave counts pointing at missing rows.
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

  def describe: java.util.Map[String, AnyRef] = Map[String, AnyRef](
    "ttlMs" -> Long.box(ttlMs),
    "updateType" -> (if (updateOnRead) "OnReadAndWrite" else "OnCreateAndWrite"),
    "visibility" -> (if (returnExpired) "ReturnExpiredIfNotCleanedUp" else "NeverReturnExpired"),
    "expiresWith" -> countStore.getOrElse("itself")).asJava
}

object TtlPolicy {
  private val IndexStoreSuffix = "keyWithIndexToValue"
  private val CountStoreSuffix = "keyToNumValues"

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

  private val validated = ConcurrentHashMap.newKeySet[String]()

  /**
   * Fails when a per-operator override names an operator or store the query does not have.
   * The driver writes every stateful operator's metadata (`state/<opId>/_metadata/metadata`)
   * while planning the first batch of a run, before any task, so the first stateful task
   * fails and the query stops at its start.
   */
  def validateOverrides(settings: JsonNode, id: StateStoreId, hadoopConf: Configuration): Unit = {
    val overrides = settings.get("ttlOverrides").fieldNames().asScala.toSeq.sorted
    if (overrides.isEmpty || !validated.add(s"${id.checkpointRootLocation}|${overrides.mkString(",")}")) return
    val operators = try readOperators(new Path(id.checkpointRootLocation), hadoopConf) catch {
      case NonFatal(e) =>
        validated.remove(s"${id.checkpointRootLocation}|${overrides.mkString(",")}")
        throw e
    }
    if (operators.isEmpty) {
      log.warn(s"keyedstate: no operator metadata under ${id.checkpointRootLocation}; cannot check the " +
        s"operator ids of ${overrides.map(KeyedStateProvider.ConfPrefix + "ttl." + _).mkString(", ")}")
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
        validated.remove(s"${id.checkpointRootLocation}|${overrides.mkString(",")}")
        throw new IllegalArgumentException(
          s"Invalid conf '${KeyedStateProvider.ConfPrefix}ttl.$key': $why. Allowed: " +
            s"${KeyedStateProvider.ConfPrefix}ttl.<operatorId> or ttl.<operatorId>.<storeName> for the " +
            s"stateful operators of this query: $allowed")
      }
    }
  }

  /** operator id -> (operator name, store names), from Spark's operator metadata (v1). */
  private def readOperators(stateRoot: Path, hadoopConf: Configuration): Map[Int, (String, Seq[String])] = {
    val fs = stateRoot.getFileSystem(hadoopConf)
    if (!fs.exists(stateRoot)) return Map.empty
    fs.listStatus(stateRoot).filter(_.isDirectory).flatMap { st =>
      val meta = new Path(new Path(st.getPath, "_metadata"), "metadata")
      st.getPath.getName.toIntOption.filter(_ => fs.exists(meta)).map { op =>
        val text = readText(meta, hadoopConf)
        val json = KeyedStateProvider.Json.readTree(text.linesIterator.drop(1).mkString("\n"))
        val name = json.path("operatorInfo").path("operatorName").asText("?")
        val stores = json.path("stateStoreInfo").elements().asScala.map(_.path("storeName").asText()).toSeq
        op -> (name, stores)
      }
    }.toMap
  }

  private[spark] def readText(path: Path, hadoopConf: Configuration): String = {
    val fs = path.getFileSystem(hadoopConf)
    val in = fs.open(path)
    try new String(IOUtils.readFullyToByteArray(in), StandardCharsets.UTF_8) finally in.close()
  }

  private val log = LoggerFactory.getLogger(classOf[TtlPolicy])
}

/**
 * "Now" for TTL: one value per micro-batch, the batch timestamp Spark recorded in the offset
 * log (`offsets/<batchId>`; a store opened at version v serves batch v), so every task of a
 * batch, and a re-execution of the batch after a failure, sees the same time. Outside a
 * micro-batch (e.g. the state data source) it is the wall clock.
 *
 * Tests can set the time through a file named by the JVM system property
 * `keyedstate.testing.clockFile` (holding epoch milliseconds). It is not a Spark conf, so a
 * query's confs cannot turn it on, and it logs a warning whenever it is used.
 */
object TtlClock {
  val TestClockProperty = "keyedstate.testing.clockFile"
  private val log = LoggerFactory.getLogger(getClass)
  private val batchTimestamps = new ConcurrentHashMap[String, java.lang.Long]()

  def now(id: StateStoreId, version: Long, hadoopConf: Configuration): Long =
    testNow().getOrElse(batchTimestamp(id, version, hadoopConf).getOrElse(System.currentTimeMillis()))

  private def testNow(): Option[Long] = Option(System.getProperty(TestClockProperty)).flatMap { file =>
    val path = Paths.get(file)
    val text = if (Files.exists(path)) new String(Files.readAllBytes(path), StandardCharsets.UTF_8).trim else ""
    text.toLongOption.map { ms =>
      log.warn(s"keyedstate: TTL time comes from the test clock $file ($ms), not from the batch timestamp")
      ms
    }
  }

  private def batchTimestamp(id: StateStoreId, version: Long, hadoopConf: Configuration): Option[Long] = {
    val offsets = new Path(new Path(new Path(id.checkpointRootLocation).getParent, "offsets"), version.toString)
    val key = offsets.toString
    Option(batchTimestamps.get(key)).map(_.longValue()).orElse {
      try {
        val fs = offsets.getFileSystem(hadoopConf)
        if (!fs.exists(offsets)) None
        else {
          val lines = TtlPolicy.readText(offsets, hadoopConf).linesIterator.toSeq
          val ts = lines.lift(1).map(KeyedStateProvider.Json.readTree).map(_.path("batchTimestampMs"))
            .filter(_.isNumber).map(_.asLong())
          ts.foreach { t =>
            if (batchTimestamps.size > 10000) batchTimestamps.clear()
            batchTimestamps.put(key, t)
          }
          ts
        }
      } catch {
        case NonFatal(e) =>
          log.warn(s"keyedstate: cannot read the batch timestamp from $offsets; TTL uses the wall clock", e)
          None
      }
    }
  }
}
