package io.keyedstate.engine

import java.util.UUID
import java.util.concurrent.atomic.AtomicLong

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, StateStoreConf, StateStoreId}
import org.apache.spark.sql.types.StructType

import io.keyedstate.bridge.ServerLaunch
import io.keyedstate.checkpoint.CheckpointFiles
import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, KeyCodec}

/**
 * The storage engine of one store partition (Spark's `RocksDB` class is the model): the version
 * lifecycle. It alone knows which version is held -- by the state server's store, the near cache
 * and the native reader alike (`loaded`) -- and it invalidates all of them together. It loads
 * versions ([[VersionLoader]]), commits them ([[CommitPipeline]]: the changelog to the
 * checkpoint, that is the commit; and to the server in one frame, applied only once the file is
 * durable), hands the near cache to one open version at a time ([[NearCacheWriter]]), composes
 * the read tiers ([[CommittedReads]]) and runs maintenance ([[SnapshotUploader]], cleanup).
 */
final class StoreEngine(val id: StateStoreId, keySchema: StructType, valueSchema: StructType,
    encoderSpec: KeyStateEncoderSpec, storeConf: StateStoreConf, hadoopConf: Configuration,
    confs: Map[String, String]) {
  import StoreEngine._

  val describe: String = s"operator ${id.operatorId} partition ${id.partitionId} store '${id.storeName}' " +
    s"(${id.storeCheckpointLocation()})"
  val files = new CheckpointFiles(id.storeCheckpointLocation(), hadoopConf,
    defaultStore = id.storeName == StateStoreId.DEFAULT_STORE_NAME)
  private val session = new ServerSession(ServerLaunch.fromConfs(confs), id.partitionId, id.toString,
    Json.writeValueAsString(scala.jdk.CollectionConverters.MapHasAsJava(confs).asJava), describe, () => invalidate())
  val fence = new RunFence(id, hadoopConf)
  private val uploader = new SnapshotUploader(files, describe, fence.runId)
  private val loader = new VersionLoader(files, uploader, describe)
  private val pipeline = new CommitPipeline(session, files, fence, describe)
  private val writer = new NearCacheWriter(this, describe, () => loaded)
  private val native = new NativeSync(this, session, describe, () => invalidate())
  private val clock = TtlClocks.forQuery(new Path(id.checkpointRootLocation).getParent, hadoopConf)
  private val maintenance = new StoreMaintenance(session, uploader, files, fence, storeConf.minVersionsToRetain,
    describe, () => closed)

  // Set whenever the store is (re)opened on a server; guarded by `this`.
  @volatile private var policy: TtlPolicy = TtlPolicy.Off
  private var cleanup: TtlCleanup = _
  @volatile private var keyCodec: KeyCodec = _
  private var cache: NearCache = _
  private var committedReads: NativeReads = _

  // THE version held by the server's store, the near cache and (once synced) the native reader,
  // with its unique id (checkpoint format 2) and its lineage: (version, id) of it and each version
  // before it down to the newest snapshot, newest first.
  @volatile private var loaded = -1L
  @volatile private var loadedId: Option[String] = None
  // The newest version loaded or durably committed, kept while `loaded` is -1 (a load or commit
  // in progress, an invalidation): cleanup counts back from it, so a round is never lost to a commit.
  @volatile private var head: (Long, Option[String]) = (-1L, None)
  @volatile private var lineage: List[(Long, Option[String])] = Nil
  /** Checkpoint format 2: every version has a unique id. Set by `checkpointFormatVersion=2`, or
   *  by the first id Spark gives ([[idOf]]). */
  def uniqueIds: Boolean = formatTwoConf || idsGiven
  private val formatTwoConf = storeConf.enableStateStoreCheckpointIds
  @volatile private var idsGiven = false

  /**
   * The unique id to load a version by, of those Spark gives. Spark's state data source reads
   * them from the commit log whatever the reading session's `checkpointFormatVersion` (Spark 4.3
   * records the format nowhere else), and a format-1 query is never given one: so a given id
   * makes this engine's checkpoint format 2 (its loads, its cleanup by lineage), where taking
   * the reading session's conf would load files by version alone and miss `<v>_<id>`.
   */
  def idOf(given: Option[String]): Option[String] = {
    if (given.isDefined) idsGiven = true
    if (uniqueIds) given else None
  }
  @volatile private var closed = false
  @volatile var numKeys = 0L
  // The newest version with a snapshot in the checkpoint (loaded from or uploaded), to bound the
  // changelogs a load replays when maintenance does not upload (short runs).
  @volatile private var lastSnapshot = 0L
  @volatile private var uploadAsked = 0L // the newest version whose commit asked for its snapshot's upload
  /** Whether this provider (one per run) has asked for its first cleanup, see [[SnapshotKick.cleanUp]]. */
  private var cleanupAsked = false

  val loadMs = new AtomicLong
  val warmMs = new AtomicLong
  val nativeGets = new AtomicLong
  def nativeSyncs: AtomicLong = native.syncs
  // Whether the near cache holds none of the held version but what its reads and writes brought
  // (a large version loaded), until the version is scanned in or forgotten (see CacheWarmer).
  @volatile private var cold = false
  // While cold: the time (ns) the cache's misses may still cost before the scan; <= 0: it is due.
  @volatile private var coldNanosLeft = 0L
  // What the cold reads of the version open since the last load or commit cost (ns).
  @volatile private var coldNanosThisVersion = 0L
  @volatile var lastCommitPhases: CommitPhases = CommitPhases(0, 0, 0)

  /** Opens the store now, so that a bad conf fails the first task. */
  def open(): Unit = synchronized { ensureOpen() }

  def codec: KeyCodec = keyCodec
  def ttlPolicy: TtlPolicy = policy
  def nearCache: NearCache = cache
  def bytesUploaded: AtomicLong = uploader.bytesUploaded
  def filesUploaded: AtomicLong = uploader.filesUploaded
  def filesReused: AtomicLong = uploader.filesReused
  def snapshotsSkipped: AtomicLong = loader.snapshotsSkipped
  def holds(version: Long): Boolean = loaded == version && version >= 0

  private def ensureOpen(): Unit = if (session.ensureOpen()) {
    val settings = session.settings
    TtlPolicy.validateOverrides(settings.json, id, hadoopConf, ServerLaunch.ConfPrefix)
    policy = TtlPolicy.resolve(settings.json, id)
    keyCodec = new KeyCodec(keySchema, valueSchema, encoderSpec, id.storeName, settings.keyGroups)
    cleanup = new TtlCleanup(this, policy, () => keyCodec, describe)
    CacheBudget.configure(settings.nearCacheBytes)
    if (cache != null) cache.clear()
    cache = new NearCache(settings.bloomFpp)
    native.reopen(settings, session.process.workDir)
    val server = new ServerReads(session, () => session.settings.scanChunkBytes, describe)
    committedReads = new NativeReads(native, () => loaded, server, () => session.settings.scanChunkBytes, nativeGets)
    loaded = -1
  }

  private def requireOpen(): Unit =
    if (closed) throw new IllegalStateException(s"keyedstate provider for $describe is closed")

  /** Makes every tier hold `version` (under checkpoint format 2 the one with `uniqueId`) and
   *  opens it for one task. */
  def begin(version: Long, uniqueId: Option[String], loadEmpty: Boolean, writable: () => Boolean): StoreVersion = {
    // Not under the engine's monitor: Spark's maintenance may close this engine meanwhile.
    if (!loadEmpty && version > 0 && !holds(version)) SnapshotKick.awaitUploads(files.dir.toString, version, describe)
    opened(version, uniqueId, loadEmpty, writable)
  }

  private def opened(version: Long, uniqueId: Option[String], loadEmpty: Boolean, writable: () => Boolean): StoreVersion = synchronized {
    requireOpen()
    val id = idOf(uniqueId)
    if (uniqueIds && id.isEmpty && version > 0 && !loadEmpty) {
      throw new IllegalStateException(s"keyedstate: checkpoint format 2 needs the unique id of version $version of $describe")
    }
    load(version, id, loadEmpty)
    val nowMs = if (policy.enabled) clock.now(version) else 0L
    val buffered = new BufferedVersion(version, session.settings.keyGroups, cachedReads(version),
      () => holds(version), writer, pipeline.expected, committedEmpty = numKeys == 0)
    val nextId = if (uniqueIds) Some(UUID.randomUUID().toString) else None
    new StoreVersion(version, id, buffered, new TtlView(buffered, policy, nowMs, writable), nowMs, fromEmpty = loadEmpty,
      nextId)
  }

  /**
   * Starts opening the changelog `v`'s commit will write ([[CheckpointFiles.openOnce]]), on a
   * thread of its own while the task computes, where opening costs requests; for a version that
   * will commit. The commit takes it; an abort, the next version's start or the close drops it.
   */
  def prepareCommit(v: StoreVersion): Unit = synchronized {
    if (!closed && files.opensAhead && v.opening.isEmpty && holds(v.version)) {
      openedAhead.foreach(_.cancel()) // a version never committed nor aborted (if it commits, it opens its own)
      val path = files.changelog(v.version + 1, v.nextId)
      // Without changelogSync nothing is written ahead: an hflush would cost the NameNode fsync too.
      val prefix = if (session.settings.changelogSync) ChangelogFormat.filePrefix else Array.emptyByteArray
      val opening = CommitWrites.open(() => { files.ensureDirs(); files.openOnce(path, prefix) })
      v.opening = Some(opening)
      openedAhead = Some(opening)
    }
  }
  private var openedAhead: Option[CommitWrites.Opening] = None // the newest; under `this`

  /** `v`'s changelog opened ahead, for its commit alone (None: the commit opens it). */
  private def takeOpening(v: StoreVersion): Option[CommitWrites.Opening] = {
    val o = v.opening
    v.opening = None
    if (o.isDefined && openedAhead == o) openedAhead = None
    o
  }

  private def load(version: Long, id: Option[String], loadEmpty: Boolean): Unit = {
    ensureOpen()
    if (loaded == version && loadedId == id && !loadEmpty) {
      // Not while another attempt's version writes into the cache: the scan sees only committed keys.
      if (cache.bloomSaturated && writer.current == null) CacheWarmer.indexKeys(cache, committedReads, numKeys)
      return
    }
    val started = System.nanoTime()
    invalidate() // until the load completes (the cache empty, not cold)
    try {
      if (loadEmpty || version == 0) {
        loader.restoreEmpty(session, version)
        numKeys = 0
        lastSnapshot = version
        lineage = List(version -> id)
      } else {
        val (keys, chain) = loader.load(session, version, id, session.settings.keyGroups, session.process.workDir)
        numKeys = keys
        lastSnapshot = chain.last._1
        lineage = chain
      }
      loaded = version
      loadedId = id
      head = version -> id
      if (numKeys <= session.settings.nearCacheWarmKeys) warm(None)
      else { // the cache stays empty until then
        committedReads.takeReadNanos()
        coldNanosLeft = numKeys * CacheWarmer.scanNanosPerKey
        coldNanosThisVersion = 0
        cold = true
      }
      if (!cleanupAsked && version > 0) { cleanupAsked = true; SnapshotKick.cleanUp(this, version -> id) }
    } catch { case NonFatal(e) => invalidate(); throw e }
    loadMs.addAndGet((System.nanoTime() - started) / 1000000)
  }

  /**
   * Makes `v`'s writes version `v.version + 1`, durably: TTL cleanup adds its deletes, the
   * changelog (encoded, and the near cache updated, as the writes happened) is finished,
   * compressed and written to the checkpoint (the commit), and shipped to the server
   * ([[CommitPipeline]]). When every write's previous existence was known (so the key count is
   * exact without waiting), the ship runs while the file is written (write-behind); otherwise it
   * follows the write. No per-key work is left for the commit.
   *
   * Snapshots are staged every `snapshotInterval` versions and after a bulk load
   * ([[StoreSettings.bulkLoad]]); the commit of such a version starts their upload in the
   * background ([[SnapshotKick]]), and Spark's maintenance uploads whatever that missed.
   * When maintenance has not uploaded one for two intervals (runs shorter than its interval,
   * e.g. scheduled availableNow jobs), the commit snapshots, uploads and cleans up itself, so
   * that a load never replays more than that many changelogs and old files still go.
   */
  def commit(v: StoreVersion, forceSnapshot: Boolean): CommitResult = synchronized {
    requireOpen()
    // Another version writes into the cache, or this one wrote and lost it (an invalidation).
    val cacheNotOurs = !writer.isWriter(v.buffered) && (writer.current != null || v.buffered.touchedCache)
    val opening = takeOpening(v)
    if (loaded != v.version || cacheNotOurs) {
      opening.foreach(_.cancel())
      writer.release(v.buffered)
      throw new IllegalStateException(s"keyedstate: $describe holds version $loaded, cannot commit on top of " +
        s"version ${v.version} (two stores of one partition were open at once)")
    }
    val newVersion = v.version + 1
    val newId = v.nextId
    try {
      // Still the cache's writer while the cleanup reads (a cold cache may scan the version in
      // and must take these writes in again) and deletes (which write into the cache too).
      val (cleaned, cleanupMs) = cleanup.collect(session, v.buffered, newVersion, v.nowMs)
      writer.release(v.buffered)
      val t0 = System.nanoTime()
      val changelog = pipeline.finish(v.buffered.buffer)
      val delta = v.buffered.buffer.keyDelta
      val unknown = v.buffered.buffer.unknownOps
      loaded = -1 // until the version is durable and shipped
      // The lineage back to the newest snapshot lets a load of this very version find it.
      val history = lineage.filter(_._1 >= math.max(1L, lastSnapshot)).flatMap { case (lv, lid) => lid.map(lv -> _) }
      val file = pipeline.encode(changelog, ChangelogMeta(Some(keyCodec.layout), newId, history, v.fromEmpty, fence.runId))
      val bytes = file.remaining().toLong
      val t1 = System.nanoTime()
      val overdue = newVersion - lastSnapshot >= 2L * session.settings.snapshotInterval
      val behind = session.settings.writeBehind && unknown == 0 && !forceSnapshot && !overdue
      val shipped = pipeline.writeAndShip(newVersion, newId, v.fromEmpty, changelog, file, cleanup.scanRequest(v.nowMs),
        behind, opening)
      if (!shipped.created) {
        pipeline.adoptFound(newVersion, newId, v.fromEmpty)
        invalidate()
        return CommitResult(newVersion, 0, cleaned, cleanupMs, newId, v.uniqueId)
      }
      val added = (if (behind) numKeys + delta else shipped.counted) - numKeys
      numKeys += added
      if (forceSnapshot || overdue) session.control("staging a snapshot")((api, h) => api.stageSnapshot(h))
      loaded = newVersion
      loadedId = newId
      head = newVersion -> newId
      native.committed(v.version, newVersion, v.buffered.buffer, cacheMisses = !cache.complete)
      cache.holdBudget()
      lineage = ((newVersion -> newId) :: lineage).filter(_._1 >= lastSnapshot)
      lastCommitPhases = CommitPhases((t1 - t0) / 1000000, shipped.writeMs, shipped.shipMs)
      cache.review() // what this version's reads found decides what the next one's writes cache
      if (cold && CacheWarmer.scanDueAfter(coldNanosThisVersion, coldNanosLeft)) coldNanosLeft = 0
      coldNanosThisVersion = 0
      if (overdue) { uploadSnapshots(); cleanupFiles() }
      else if (forceSnapshot || newVersion % session.settings.snapshotInterval == 0 || session.settings.bulkLoad(added, numKeys)) {
        uploadAsked = newVersion
        SnapshotKick.request(this, newVersion)
      }
      CommitResult(newVersion, bytes, cleaned, cleanupMs, newId, v.uniqueId)
    } catch {
      case NonFatal(e) => invalidate(); throw e
    } finally opening.foreach(_.cancel()) // a no-op once the write took it
  }

  /** The committed value of `key` if this engine holds `version` (Some(null) = absent), for a
   *  sibling store's cleanup; None when it holds another version. */
  def committedValue(key: Bytes, version: Long): Option[Array[Byte]] = synchronized {
    if (closed || loaded != version) None else Some(cachedReads(version).get(key))
  }

  private def cachedReads(version: Long) = new CachedReads(cache, committedReads, n => coldMisses(version, n))

  /** Adds up what the reads the cache missed since a load left it cold cost
   *  ([[CacheWarmer.readCost]]); once that is what a scan of the version costs, or a commit
   *  found the scan due ([[CacheWarmer.scanDueAfter]]: `coldNanosLeft` 0), scans it in
   *  (mid-version if need be: see [[warm]]). Only the held version's reads count and scan: a
   *  late attempt of an older version's say nothing of the held one's. (Any writer holds it:
   *  a version claims the cache only while it is `loaded`.) */
  private def coldMisses(version: Long, n: Int): Unit = if (cold && loaded == version) {
    val cost = CacheWarmer.readCost(n, committedReads.takeReadNanos())
    coldNanosThisVersion += cost
    coldNanosLeft -= cost
    if (coldNanosLeft < 0) synchronized { // a load, commit or invalidation waits for the scan
      if (cold && loaded == version) {
        // A scan that fails halfway leaves the cache partial but marked complete: forget it all.
        try warm(Option(writer.current).map(_.buffer)) catch { case NonFatal(e) => invalidate(); throw e }
      }
    }
  }

  /** Fills the cache with the held version and, if a version is open (`writes`), its writes. */
  private def warm(writes: Option[WriteBuffer]): Unit = {
    val started = System.nanoTime()
    cold = false
    committedReads.prepareScan()
    CacheWarmer.warmUnder(cache, committedReads, numKeys, writes)
    warmMs.addAndGet((System.nanoTime() - started) / 1000000)
  }

  /** A version that will not commit: if its writes reached the near cache, the cache no longer
   *  shows the committed version, so everything is reloaded. */
  def abandon(v: StoreVersion): Unit = synchronized {
    takeOpening(v).foreach(_.cancel())
    if (v.buffered.touchedCache && writer.isWriter(v.buffered)) invalidate()
    writer.release(v.buffered)
  }

  /** Forget the version held: the next task reloads it from the checkpoint. */
  def invalidate(): Unit = synchronized {
    writer.clear()
    loaded = -1
    cold = false
    if (cache != null) cache.clear()
    native.reset()
  }

  /** RocksDB memory of the store in the server (0 when unknown); never waits for an apply. */
  def serverMemoryBytes(): Long =
    if (closed || !session.isAlive) 0L
    else try session.maintenance("reading store memory")((api, h) => api.memoryBytes(h)).toLong catch { case NonFatal(_) => 0L }

  /** Uploads the snapshots the server staged (maintenance thread, [[StoreMaintenance.upload]]). */
  def uploadSnapshots(through: Long = -1L): Unit = {
    if (closed || !session.isAlive || keyCodec == null) return
    maintenance.upload(keyCodec.layout, if (policy.enabled) Some(policy.describe) else None, uniqueIdOf, through) {
      v => lastSnapshot = math.max(lastSnapshot, v)
    }
  }

  /** The unique id of a version of the current lineage (None: format 1); Left when unknown. */
  private def uniqueIdOf(version: Long): Either[Unit, Option[String]] =
    if (!uniqueIds) Right(None) else lineage.find(_._1 == version).map(e => Right(e._2)).getOrElse(Left(()))

  /** Deletes what no retained version needs (maintenance thread, [[StoreMaintenance.cleanUp]]),
   *  counting back from `asOf` (a version loaded earlier), else from the newest version loaded or
   *  committed (`head`). */
  def cleanupFiles(asOf: Option[(Long, Option[String])] = None): Unit =
    maintenance.cleanUp(() => asOf.getOrElse(head), () => lastSnapshot, byLineage = uniqueIds)

  def close(): Unit = synchronized {
    if (closed) return
    // Spark closes a stopped query's providers soon after (its maintenance, once the coordinator
    // no longer lists their run; its doMaintenance just before uploads only what is staged by
    // then). A snapshot a commit asked for may still be applying behind: closing the store would
    // drop it, and the next run would replay every changelog since the previous snapshot. So
    // that upload is finished first, as the JVM's exit does ([[SnapshotKick]]).
    if (uploadAsked > lastSnapshot) SnapshotKick.uploading(files.dir.toString, uploadAsked)(uploadSnapshots(uploadAsked))
    closed = true
    openedAhead.foreach(_.cancel())
    openedAhead = None
    if (cache != null) cache.clear()
    native.close()
    session.close()
  }
}

object StoreEngine {
  private val Json = new com.fasterxml.jackson.databind.ObjectMapper()
}
