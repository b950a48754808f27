package io.keyedstate.engine

import java.time.Duration
import java.util.UUID
import java.util.concurrent.{Callable, ExecutionException, Executors, FutureTask, RejectedExecutionException, TimeUnit}
import java.util.concurrent.atomic.{AtomicInteger, AtomicLong}

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.hadoop.util.ShutdownHookManager
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, StateStoreConf, StateStoreId}
import org.apache.spark.sql.types.StructType
import org.slf4j.LoggerFactory

import io.keyedstate.bridge.{ServerLaunch, StateServerProcess}
import io.keyedstate.checkpoint.{CheckpointFileException, CheckpointFiles, StoreCleanup}
import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, Frames, KeyCodec}

/** What a commit produced: the new version, its changelog size, its TTL cleanup. */
final case class CommitResult(version: Long, changelogBytes: Long, ttlCleanedUp: Long, ttlCleanupMs: Long,
    uniqueId: Option[String] = None, baseUniqueId: Option[String] = None)

/** Where a commit's time went, in ms: encoding the changelog (and updating the near cache),
 *  writing it to the checkpoint, shipping it to Python. In a write-behind commit the write (on
 *  its own thread) and the ship (hold, then release) overlap: the latency is about encode plus
 *  the longer of the two, not their sum. */
final case class CommitPhases(encodeMs: Long, writeMs: Long, shipMs: Long)

/** One version of the store, open for one task: its view (TTL over the version's own writes
 *  over the committed version) and the TTL "now" of its batch. */
final class StoreVersion(val version: Long, val uniqueId: Option[String], val buffered: BufferedVersion,
    val ttl: TtlView, val nowMs: Long, val fromEmpty: Boolean) {
  def view: KeyValueView = ttl
}

/**
 * The storage engine of one store partition (Spark's `RocksDB` class is the model): the version
 * lifecycle. It alone knows which version is held -- by the state server's store, the near cache
 * and the native reader alike (`loaded`) -- and it invalidates all of them together. It loads
 * versions ([[VersionLoader]]), commits them (the changelog to the checkpoint: that is the
 * commit; and to the server in one frame, applied only once the file is durable), composes the
 * read tiers ([[CommittedReads]]) and runs maintenance ([[SnapshotUploader]], cleanup).
 */
final class StoreEngine(val id: StateStoreId, keySchema: StructType, valueSchema: StructType,
    encoderSpec: KeyStateEncoderSpec, storeConf: StateStoreConf, hadoopConf: Configuration,
    confs: Map[String, String]) {
  import StoreEngine._

  val describe: String = s"operator ${id.operatorId} partition ${id.partitionId} store '${id.storeName}' " +
    s"(${id.storeCheckpointLocation()})"
  val files = new CheckpointFiles(id.storeCheckpointLocation(), hadoopConf)
  private val session = new ServerSession(ServerLaunch.fromConfs(confs), id.partitionId, id.toString,
    Json.writeValueAsString(scala.jdk.CollectionConverters.MapHasAsJava(confs).asJava), describe, () => invalidate())
  val fence = new RunFence(id, hadoopConf)
  private val uploader = new SnapshotUploader(files, describe, fence.runId)
  private val fileCleanup = new StoreCleanup(files)
  private val loader = new VersionLoader(files, uploader, describe)
  private val clock = TtlClocks.forQuery(new Path(id.checkpointRootLocation).getParent, hadoopConf)
  private val maintenanceMutex = new Object // snapshot upload vs cleanup

  // Set whenever the store is (re)opened on a server; guarded by `this`.
  @volatile private var policy: TtlPolicy = TtlPolicy.Off
  private var cleanup: TtlCleanup = _
  @volatile private var keyCodec: KeyCodec = _
  private var cache: NearCache = _
  private var native: NativeReader = _ // null: native reads off or unavailable
  private var committedReads: CommittedReads = _

  // THE version held by the server's store, the near cache and (once synced) the native reader,
  // with its unique id (checkpoint format 2) and its lineage: (version, id) of it and each version
  // before it down to the newest snapshot, newest first.
  @volatile private var loaded = -1L
  @volatile private var loadedId: Option[String] = None
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
  @volatile private var nativeShows = -1L
  @volatile private var closed = false
  @volatile var numKeys = 0L
  // The newest version with a snapshot in the checkpoint (loaded from or uploaded), to bound the
  // changelogs a load replays when maintenance does not upload (short runs).
  @volatile private var lastSnapshot = 0L
  @volatile private var uploadAsked = 0L // the newest version whose commit asked for its snapshot's upload
  /** Whether this provider (one per run) has asked for its first cleanup, see [[SnapshotKick.cleanUp]]. */
  private var cleanupAsked = false
  // Sizes the next version's write buffer starts with: the last commit's, so that it does not
  // grow (and copy) its index and changelog while a batch writes.
  @volatile private var expected = WriteBuffer.Expected.None
  // Room the next commit's compressed changelog starts with: the last one's and a margin (0: the
  // worst case, compressBound, as large as the changelog itself).
  private var expectedFileBytes = 0L

  val loadMs = new AtomicLong
  val warmMs = new AtomicLong
  val nativeGets = new AtomicLong
  // Reads of the held version the cache may still miss before the engine scans the version in
  // (see CacheWarmer); -1: the cache was warmed (or the version is not held).
  @volatile private var coldReadsLeft = -1L
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
    if (native != null) native.close()
    NativeReader.configure(settings.nativeBlockCacheBytes, settings.memoryBounded)
    native = if (!settings.nativeReads) null
      else new NativeReader(session.process.workDir.resolve("native").resolve(UUID.randomUUID().toString))
    val server = new ServerReads(session, () => session.settings.scanChunkBytes, describe)
    committedReads = new NativeReads(() => nativeAt(loaded), server, () => session.settings.scanChunkBytes, nativeGets)
    loaded = -1
    nativeShows = -1
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
    val buffered = new BufferedVersion(version, session.settings.keyGroups, cachedReads(),
      () => holds(version), cacheOwnership, expected, committedEmpty = numKeys == 0)
    new StoreVersion(version, id, buffered, new TtlView(buffered, policy, nowMs, writable), nowMs, fromEmpty = loadEmpty)
  }

  private def load(version: Long, id: Option[String], loadEmpty: Boolean): Unit = {
    ensureOpen()
    if (loaded == version && loadedId == id && !loadEmpty) {
      // Not while another attempt's version writes into the cache: the scan sees only committed keys.
      if (cache.bloomSaturated && writer == null) CacheWarmer.indexKeys(cache, committedReads, numKeys)
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
      if (numKeys <= session.settings.nearCacheWarmKeys) warm(None)
      else coldReadsLeft = numKeys / CacheWarmer.ScanKeysPerRead // the cache stays empty until then
      if (!cleanupAsked && version > 0) { cleanupAsked = true; SnapshotKick.cleanUp(this, version -> id) }
    } catch { case NonFatal(e) => invalidate(); throw e }
    loadMs.addAndGet((System.nanoTime() - started) / 1000000)
  }

  /**
   * Makes `v`'s writes version `v.version + 1`, durably: TTL cleanup adds its deletes, the
   * changelog (encoded, and the near cache updated, as the writes happened) is finished,
   * compressed and written to the checkpoint (the commit), and shipped to the server. When every
   * write's previous existence was known (so the key count is exact without waiting), the ship
   * runs while the file is written, held unapplied by the server until the file is durable, then
   * applied behind; otherwise it follows the write and is applied before the reply. No per-key
   * work is left for the commit.
   *
   * Snapshots are staged every `snapshotInterval` versions and after a bulk load ([[bulk]]); the
   * commit of such a version starts their upload in the background, and Spark's maintenance
   * uploads whatever that missed.
   * When maintenance has not uploaded one for two intervals (runs shorter than its interval,
   * e.g. scheduled availableNow jobs), the commit snapshots, uploads and cleans up itself, so
   * that a load never replays more than that many changelogs and old files still go.
   */
  def commit(v: StoreVersion, forceSnapshot: Boolean): CommitResult = synchronized {
    requireOpen()
    // Another version writes into the cache, or this one wrote and lost it (an invalidation).
    val cacheNotOurs = !(writer eq v.buffered) && (writer != null || v.buffered.touchedCache)
    if (loaded != v.version || cacheNotOurs) {
      release(v.buffered)
      throw new IllegalStateException(s"keyedstate: $describe holds version $loaded, cannot commit on top of " +
        s"version ${v.version} (two stores of one partition were open at once)")
    }
    val newVersion = v.version + 1
    val newId = if (uniqueIds) Some(UUID.randomUUID().toString) else None
    try {
      // Still the cache's writer while the cleanup reads (a cold cache may scan the version in
      // and must take these writes in again) and deletes (which write into the cache too).
      val (cleaned, cleanupMs) = cleanup.collect(session, v.buffered, newVersion, v.nowMs)
      release(v.buffered)
      val t0 = System.nanoTime()
      val changelog = v.buffered.buffer.finish() // encoded as the writes happened
      if (v.buffered.buffer.size > 0) expected = v.buffered.buffer.observed.grown
      val delta = v.buffered.buffer.keyDelta
      val unknown = v.buffered.buffer.unknownOps
      loaded = -1 // until the version is durable and shipped
      // The lineage back to the newest snapshot lets a load of this very version find it.
      val history = lineage.filter(_._1 >= math.max(1L, lastSnapshot)).flatMap { case (lv, lid) => lid.map(lv -> _) }
      val file = ChangelogFormat.compress(changelog, ChangelogMeta(Some(keyCodec.layout), newId, history, v.fromEmpty, fence.runId), expectedFileBytes)
      val bytes = file.remaining().toLong
      expectedFileBytes = bytes + bytes / 4 + (64 << 10)
      val t1 = System.nanoTime()
      files.ensureDirs()
      val overdue = newVersion - lastSnapshot >= 2L * session.settings.snapshotInterval
      val behind = session.settings.writeBehind && unknown == 0 && !forceSnapshot && !overdue
      val path = files.changelog(newVersion, newId)
      // The file of an earlier run's attempt of this version is replaced, with its snapshot.
      val publish = () => files.createOnce(path, file) ||
        (rerunOf(newVersion, newId, v.fromEmpty) && files.replace(path, file, Seq(files.manifest(newVersion, newId))))
      val scan = cleanup.scanRequest(v.nowMs)
      // Write-behind: the changelog is shipped, held unapplied by the server, while its file is
      // written; the commit then waits for the longer of the two, not their sum.
      val (created, writeMs, counted, shipMs) = if (behind) {
        val writing = CommitWrites.start(publish)
        // A task killed (interrupted) while it waits for the write interrupts the write too, and
        // the release or drop still reaches the server (an interrupted NIO channel closes); the
        // interrupt is then kept for Spark. Killed during the hold, the hold fails, and so does
        // the write.
        var interrupted = false
        def awaitWrite() = { val (r, i) = CommitWrites.await(writing); interrupted ||= i; r }
        try {
          val s0 = System.nanoTime()
          try session.data(s"committing version $newVersion of $describe")((c, h) => c.apply(h, changelog, Frames.ApplyHold, scan))
          catch {
            case e: Throwable =>
              writing.interrupt() // the version fails: no need to wait for a whole write
              awaitWrite().left.foreach(e.addSuppressed)
              throw e
          }
          val s1 = System.nanoTime()
          val (written, wMs) = awaitWrite() match {
            case Right(r) => r
            case Left(e) => dropHeld(); throw e
          }
          val s2 = System.nanoTime()
          if (written) {
            try session.data(s"committing version $newVersion of $describe")((c, h) => c.release(h, apply = true))
            catch { case e: Throwable => dropHeld(); throw e } // if the RELEASE never arrived, nothing stays held
          } else dropHeld()
          (written, wMs, 0L, (s1 - s0 + System.nanoTime() - s2) / 1000000)
        } finally if (interrupted) Thread.currentThread().interrupt()
      } else {
        val w0 = System.nanoTime()
        val written = publish()
        val w1 = System.nanoTime()
        val n = if (written) session.data(s"committing version $newVersion of $describe")(
          (c, h) => c.apply(h, changelog, Frames.ApplyNow, scan)) else 0L
        (written, (w1 - w0) / 1000000, n, (System.nanoTime() - w1) / 1000000)
      }
      if (!created) {
        // Another attempt of this version in this run committed first (a retried or speculative
        // task under checkpoint format 1), or this one's file was published before its write
        // failed (a killed task): the file is the version. Loads take it from there. Not a file
        // an offline writer left uncommitted (a query's batch is no rerun of it, nor it of the batch).
        val found = files.readChangelogMeta(newVersion, newId)
        if (found.fromEmpty != v.fromEmpty) {
          val writer = if (v.fromEmpty) "by a batch of the query" else "from empty by an offline writer (migrate, the state processor or a repartition)"
          throw new CheckpointFileException(s"keyedstate: version $newVersion of $describe is already in the checkpoint " +
            s"($path), written $writer that never committed: it is not this version. Delete its files " +
            s"($newVersion.ks-*, or ${newVersion}_<id>.ks-* under checkpoint format 2, in ${files.dir}) and retry")
        }
        // This run replaced an earlier run's file, and a task of a stopped run wrote its own in
        // the gap between the delete and the write: that attempt is not this run's version.
        if (fence.runId.isDefined && found.runId != fence.runId) {
          throw new CheckpointFileException(s"keyedstate: version $newVersion of $describe: run ${fence.runId.get} " +
            s"replaced $path, but ${found.runId.fold("a writer without a run id")(r => s"run $r")} wrote its own file " +
            "there first (a task of a stopped run still committing); this task fails, and its retry replaces that file")
        }
        log.warn(s"keyedstate: version $newVersion of $describe was already in the checkpoint; using that file")
        invalidate()
        return CommitResult(newVersion, 0, cleaned, cleanupMs, newId, v.uniqueId)
      }
      val added = (if (behind) numKeys + delta else counted) - numKeys
      numKeys += added
      if (forceSnapshot || overdue) session.control("staging a snapshot")((api, h) => api.stageSnapshot(h))
      loaded = newVersion
      loadedId = newId
      lineage = ((newVersion -> newId) :: lineage).filter(_._1 >= lastSnapshot)
      lastCommitPhases = CommitPhases((t1 - t0) / 1000000, writeMs, shipMs)
      cache.review() // what this version's reads found decides what the next one's writes cache
      if (overdue) { uploadSnapshots(); cleanupFiles() }
      else if (forceSnapshot || newVersion % session.settings.snapshotInterval == 0 || bulk(added)) {
        uploadAsked = newVersion
        SnapshotKick.request(this, newVersion)
      }
      CommitResult(newVersion, bytes, cleaned, cleanupMs, newId, v.uniqueId)
    } catch {
      case NonFatal(e) => invalidate(); throw e
    }
  }

  /**
   * Whether the changelog of `version` a commit found in the checkpoint is an earlier run's
   * attempt, which Spark never committed and runs again (that run stopped or died between its
   * tasks' commits and its commit log), possibly over a changed query or other input. The
   * attempt Spark commits is the version, as Spark's own providers overwrite `<v>.delta` and
   * `<v>.changelog`: the caller replaces the file. An attempt of this run (a retried or
   * speculative task: the same batch over the same input) stays the version, and so does an
   * offline writer's file (the caller refuses it). Only the store's active instance replaces: a
   * provider of a stopped run fails instead of overwriting what the active run committed.
   */
  private def rerunOf(version: Long, id: Option[String], fromEmpty: Boolean): Boolean = fence.runId.exists { run =>
    val found = files.readChangelogMeta(version, id)
    val writer = found.runId.fold("an earlier run")(r => s"run $r")
    if (found.fromEmpty != fromEmpty || found.runId.contains(run)) false
    else if (!fence.isActive) {
      throw new CheckpointFileException(s"keyedstate: version $version of $describe is in the checkpoint " +
        s"(${files.changelog(version, id)}), written by $writer, and this provider's run $run is not the store's " +
        "active instance: it does not replace the file")
    } else {
      log.warn(s"keyedstate: version $version of $describe was written by $writer, which Spark did not commit; " +
        s"run $run executes it again and replaces it")
      true
    }
  }

  /** Drops the changelog a commit left held on the server (its file was not written, or another
   *  attempt's was), best effort: the caller invalidates or fails anyway, and a reload's restore
   *  drops whatever is still held. */
  private def dropHeld(): Unit =
    try session.data(s"dropping an unwritten version of $describe")((c, h) => c.release(h, apply = false))
    catch { case NonFatal(e) => log.info(s"keyedstate: no held changelog of $describe dropped (${e.getMessage}); the reload drops any") }

  /** A bulk load (a first batch over a backlog, a catch-up that brings new keys): the version
   *  added at least snapshotBulkKeys keys, at least as many as were there before. The server
   *  stages such a version's snapshot right after its apply (server/store.py's `_bulk`, the same
   *  rule, on the same exact counts) and the commit asks for its upload at once, so that a load
   *  after a stop does not replay it. */
  private def bulk(added: Long): Boolean = {
    val least = session.settings.snapshotBulkKeys
    least > 0 && added >= least && added >= numKeys - added
  }

  /** The committed value of `key` if this engine holds `version` (Some(null) = absent), for a
   *  sibling store's cleanup; None when it holds another version. */
  def committedValue(key: Bytes, version: Long): Option[Array[Byte]] = synchronized {
    if (closed || loaded != version) None else Some(cachedReads().get(key))
  }

  private def cachedReads() = new CachedReads(cache, committedReads, coldMisses)

  /** Counts reads the cache missed since a load left it cold; once they have cost about what a
   *  scan of the version costs, scans it in (mid-version if need be: see [[warm]]). */
  private def coldMisses(n: Int): Unit = if (coldReadsLeft >= 0) {
    coldReadsLeft -= n
    // A scan that fails halfway leaves the cache partial but marked complete: forget it all.
    if (coldReadsLeft < 0 && loaded >= 0) {
      try warm(Option(writer).map(_.buffer)) catch { case NonFatal(e) => invalidate(); throw e }
    }
  }

  /** Fills the cache with the held version and, if a version is open (`writes`), its writes. */
  private def warm(writes: Option[WriteBuffer]): Unit = {
    val started = System.nanoTime()
    coldReadsLeft = -1
    CacheWarmer.warmUnder(cache, committedReads, numKeys, writes)
    warmMs.addAndGet((System.nanoTime() - started) / 1000000)
  }

  /** The native reader showing `version`, synced once per version (Python finishes its pending
   *  applies and flushes, then the reader catches up); null when reads go to the server. */
  private def nativeAt(version: Long): NativeReader = {
    val reader = native
    if (reader == null || (nativeShows == version && version >= 0)) reader else syncNative(version)
  }

  private def syncNative(version: Long): NativeReader = synchronized {
    val reader = native
    if (reader == null || version < 0 || nativeShows == version) reader
    else {
      val (held, dir) = session.data(s"syncing $describe")((c, h) => c.sync(h))
      if (held != version) {
        invalidate()
        throw new IllegalStateException(s"keyedstate: the state server holds version $held of $describe, expected $version")
      }
      try { reader.follow(dir); nativeShows = version; reader } catch {
        case NonFatal(e) =>
          log.warn(s"keyedstate: cannot read $describe natively from $dir (RocksDB secondary instance); " +
            "its reads go through the state server", e)
          reader.close()
          native = null
          null
      }
    }
  }

  // The one open version whose writes go into the near cache (each write as it happens).
  @volatile private var writer: BufferedVersion = _

  private val cacheOwnership = new BufferedVersion.CacheOwnership {
    override def isWriter(v: BufferedVersion): Boolean = writer eq v
    override def claim(v: BufferedVersion): Unit = claimCache(v)
    /** Another open version's writes run ahead of the committed version in the cache. Spark's
     *  RocksDB provider makes the second attempt wait for the first one's lock; here it gives
     *  way, as it does at its first write. */
    override def checkReads(v: BufferedVersion): Unit = {
      val w = writer
      if (w != null && !(w eq v)) {
        throw new IllegalStateException(s"keyedstate: two stores of $describe open at once: version ${w.version}'s " +
          "writes are in the near cache and not committed, and this attempt's reads would see them; this attempt gives way")
      }
    }
  }

  /** Makes `v` the version that writes into the near cache; a second one open at once (a zombie
   *  or duplicate attempt of the partition in this JVM) fails instead of mixing its writes in. */
  private def claimCache(v: BufferedVersion): Unit = synchronized {
    if (writer != null && !(writer eq v)) {
      throw new IllegalStateException(s"keyedstate: two stores of $describe write at once (versions " +
        s"${writer.version} and ${v.version}); this attempt gives way")
    }
    if (loaded != v.version) {
      throw new IllegalStateException(s"keyedstate: $describe holds version $loaded, cannot write on top of version " +
        s"${v.version} (two stores of one partition were open at once)")
    }
    writer = v
  }

  private def release(v: BufferedVersion): Unit = if (writer eq v) writer = null

  /** A version that will not commit: if its writes reached the near cache, the cache no longer
   *  shows the committed version, so everything is reloaded. */
  def abandon(v: StoreVersion): Unit = synchronized {
    if (v.buffered.touchedCache && (writer eq v.buffered)) invalidate()
    release(v.buffered)
  }

  /** Forget the version held: the next task reloads it from the checkpoint. */
  def invalidate(): Unit = synchronized {
    writer = null
    loaded = -1
    coldReadsLeft = -1
    nativeShows = -1
    if (cache != null) cache.clear()
    if (native != null) native.reset()
  }

  /** RocksDB memory of the store in the server (0 when unknown); never waits for an apply. */
  def serverMemoryBytes(): Long =
    if (closed || !session.isAlive) 0L
    else try session.maintenance("reading store memory")((api, h) => api.memoryBytes(h)).toLong catch { case NonFatal(_) => 0L }

  /**
   * Uploads the snapshots the server staged (maintenance thread). A stopped run's provider does
   * this once more before Spark closes it, while the next run may already work on the same
   * directory: that is safe because a snapshot only adds files under fresh names, lists only files
   * verified to be there, replaces a manifest only when it is of another run's attempt
   * ([[SnapshotUploader]]), and a load skips a snapshot that turns out broken anyway. Deleting
   * is not: only the active instance cleans up ([[cleanupFiles]]).
   * `through`: see [[SnapshotUploader.upload]].
   */
  def uploadSnapshots(through: Long = -1L): Unit = {
    if (closed || !session.isAlive || keyCodec == null) return
    maintenanceMutex.synchronized {
      retriedLater("snapshot upload") {
        uploader.upload(session, session.settings.keyGroups, keyCodec.layout,
          if (policy.enabled) Some(policy.describe) else None, uniqueIdOf, through).foreach(v => lastSnapshot = math.max(lastSnapshot, v))
      }
    }
  }

  /**
   * Maintenance never throws: Spark unloads and closes a provider whose maintenance call threw,
   * even while a task is using its store (that task then fails, and the next batch reloads the
   * version from the checkpoint). A failed upload or cleanup changes nothing that loads need and
   * is simply tried again at the next tick.
   */
  private def retriedLater(what: String)(f: => Unit): Unit =
    try f catch {
      case NonFatal(e) => if (!closed) log.warn(s"keyedstate: $what of $describe failed; retried at the next maintenance", e)
    }

  // Lock order: the engine's monitor, then maintenanceMutex; code holding maintenanceMutex reads
  // only volatile fields of the engine, never its monitor (a commit may upload and clean up).

  /** The unique id of a version of the current lineage (None: format 1); Left when unknown. */
  private def uniqueIdOf(version: Long): Either[Unit, Option[String]] =
    if (!uniqueIds) Right(None) else lineage.find(_._1 == version).map(e => Right(e._2)).getOrElse(Left(()))

  /**
   * Deletes what no retained version needs (maintenance thread), if active ([[RunFence]]),
   * counting back from `asOf` (a version loaded earlier), else from the version held now.
   */
  def cleanupFiles(asOf: Option[(Long, Option[String])] = None): Unit = maintenanceMutex.synchronized {
    if (closed || !fence.isActive) return
    val head = asOf.getOrElse(loaded -> loadedId)
    if (head._1 <= 0) return // nothing committed held: the newest file listed may be an uncommitted attempt
    retriedLater("cleanup") {
      val deleted = fileCleanup.run(storeConf.minVersionsToRetain, head._1, head._2, lastSnapshot, byLineage = uniqueIds)
      if (deleted > 0) log.info(s"keyedstate: cleanup deleted $deleted files of $describe")
    }
  }

  def close(): Unit = synchronized {
    if (closed) return
    // Spark closes a stopped query's providers soon after (its maintenance, once the coordinator
    // no longer lists their run; its doMaintenance just before uploads only what is staged by
    // then). A snapshot a commit asked for may still be applying behind: closing the store would
    // drop it, and the next run would replay every changelog since the previous snapshot. So
    // that upload is finished first, as the JVM's exit does ([[SnapshotKick]]).
    if (uploadAsked > lastSnapshot) SnapshotKick.uploading(files.dir.toString, uploadAsked)(uploadSnapshots(uploadAsked))
    closed = true
    if (cache != null) cache.clear()
    if (native != null) { native.close(); native = null }
    session.close()
  }
}

/**
 * Uploads a snapshot as soon as the server has staged it, on a few background threads per
 * executor (an upload mostly waits: for the server to finish applying, for the file system),
 * instead of at the next maintenance tick (60 s by default): a query stopped in between would
 * otherwise restart by replaying every changelog since the previous snapshot. Maintenance still
 * uploads whatever this missed; both go through [[StoreEngine.uploadSnapshots]].
 *
 * The same holds when the application stops right after a snapshot version: at the JVM's exit,
 * uploads already asked for are given up to [[ExitWait]] to finish, before Hadoop closes its
 * file systems (a Hadoop shutdown hook above theirs) and before the state servers stop. An
 * upload cut short leaves no manifest, so nothing half-written is ever loaded.
 *
 * Cleanup is Spark's maintenance's too, and a run shorter than its interval (a scheduled
 * availableNow job) never gets one: each run's first load therefore cleans up once, here, on
 * what earlier runs uploaded, counting from the version it loaded. Cleanups run on a thread of
 * their own that the JVM's exit does not wait for (an interrupted cleanup only leaves files for
 * the next one), so they never delay the uploads that exit does wait for.
 */
private object SnapshotKick {
  private val ExitWait = Duration.ofSeconds(30)
  private val log = LoggerFactory.getLogger("io.keyedstate.engine.SnapshotKick")
  private val pending = new AtomicInteger
  private def daemons(threads: Int, name: String) = Executors.newFixedThreadPool(threads, (r: Runnable) => {
    val t = new Thread(r, name)
    t.setDaemon(true)
    t
  })
  private val thread = daemons(4, "keyedstate-snapshot-upload")
  private val cleaner = daemons(1, "keyedstate-cleanup")
  private val drain: Runnable = () => {
    if (pending.get > 0) log.info(s"keyedstate: finishing ${pending.get} snapshot upload(s) before the JVM exits " +
      s"(at most ${ExitWait.getSeconds} s)")
    thread.shutdown()
    if (!thread.awaitTermination(ExitWait.toMillis, TimeUnit.MILLISECONDS)) {
      log.warn(s"keyedstate: ${pending.get} snapshot upload(s) did not finish before the JVM exits; " +
        "the next run uploads or replaces them")
    }
  }
  StateServerProcess.runBeforeServersStop(drain)
  try ShutdownHookManager.get().addShutdownHook(drain, FileSystem.SHUTDOWN_HOOK_PRIORITY + 20, ExitWait.getSeconds + 5, TimeUnit.SECONDS)
  catch { case NonFatal(_) => } // first used while the JVM already exits: the servers' hook still drains

  def request(engine: StoreEngine, version: Long): Unit = {
    val dir = engine.files.dir.toString
    val upload = begin(dir, version)
    if (!submit(try engine.uploadSnapshots(version) finally end(dir, upload))) end(dir, upload)
  }

  /** Runs the upload of `version`'s snapshot of the store partition in `dir` on the caller's
   *  thread (a provider's close), counted as in flight for [[awaitUploads]]. */
  def uploading(dir: String, version: Long)(work: => Unit): Unit = {
    val upload = begin(dir, version)
    try work finally end(dir, upload)
  }

  /**
   * Waits, at most [[LoadWait]], until no upload of a snapshot at or below `version` of the store
   * partition in `dir` is in flight in this JVM. A new run's first load of a partition this
   * executor served just before (a query restarted in the same application) then starts from
   * the snapshot the previous run's last snapshot commit asked for, instead of replaying every
   * changelog since the one before: that upload waits for its version's apply behind, and a load
   * that did not wait for it would replay every changelog since the snapshot before. A load on
   * another executor cannot wait, and replays as before; so does a load once a wait for this
   * partition gave up, until a newer upload begins.
   */
  def awaitUploads(dir: String, version: Long, describe: String): Unit = {
    val started = System.nanoTime()
    val deadline = started + LoadWait.toNanos
    val outcome = inFlight.synchronized {
      // Uploads of versions the load can start from, and begun since a load last gave up on
      // this partition: a hung upload costs one wait, not one per load.
      def awaited = inFlight.getOrElse(dir, Nil).exists(u => u.version <= version && u.begun > gaveUp.getOrElse(dir, Long.MinValue))
      if (!awaited) None
      else {
        while (awaited && System.nanoTime() < deadline) inFlight.wait(math.max(1L, (deadline - System.nanoTime()) / 1000000))
        if (awaited) gaveUp(dir) = System.nanoTime()
        Some(!awaited)
      }
    }
    val waited = (System.nanoTime() - started) / 1000000
    outcome.foreach { finished =>
      if (finished) log.info(s"keyedstate: loading $describe waited $waited ms for the snapshot upload in flight")
      else log.warn(s"keyedstate: loading $describe without the snapshot upload still in flight after $waited ms; " +
        "the load replays the changelogs since the last snapshot uploaded")
    }
  }

  private val LoadWait = Duration.ofSeconds(20)
  private final class Upload(val version: Long, val begun: Long)
  private val inFlight = scala.collection.mutable.Map.empty[String, List[Upload]] // per partition directory
  private val gaveUp = scala.collection.mutable.Map.empty[String, Long] // per partition directory: when a load last did

  private def begin(dir: String, version: Long): Upload = inFlight.synchronized {
    val upload = new Upload(version, System.nanoTime())
    inFlight(dir) = upload :: inFlight.getOrElse(dir, Nil)
    upload
  }

  private def end(dir: String, upload: Upload): Unit = inFlight.synchronized {
    val left = inFlight.getOrElse(dir, Nil).filterNot(_ eq upload)
    if (left.isEmpty) inFlight.remove(dir) else inFlight(dir) = left
    inFlight.notifyAll()
  }

  def cleanUp(engine: StoreEngine, loaded: (Long, Option[String])): Unit =
    cleaner.execute(() => engine.cleanupFiles(Some(loaded)))

  /** Whether `work` was queued (not when the JVM exits). */
  private def submit(work: => Unit): Boolean = {
    pending.incrementAndGet()
    try { thread.execute(() => try work finally pending.decrementAndGet()); true }
    catch { case _: RejectedExecutionException => pending.decrementAndGet(); false } // exiting
  }
}

/**
 * Writes write-behind commits' changelog files to the checkpoint on threads of their own, so that
 * the task thread ships the same changelog to the state server meanwhile ([[StoreEngine.commit]]).
 * One thread per commit in flight, at most one per task slot.
 */
private object CommitWrites {
  private val pool = Executors.newCachedThreadPool((r: Runnable) => {
    val t = new Thread(r, "keyedstate-commit-write")
    t.setDaemon(true)
    t
  })

  /** Starts `write` on a pool thread; its result and ms come from [[await]]. */
  def start(write: () => Boolean): Write = {
    val w = new Write(write)
    pool.execute(w.task)
    w
  }

  final class Write(write: () => Boolean) {
    private var runner: Thread = _ // under this Write's lock, like `stopped`
    private var stopped = false
    private[CommitWrites] val task = new FutureTask[(Boolean, Long)](new Callable[(Boolean, Long)] {
      override def call(): (Boolean, Long) = {
        Write.this.synchronized {
          runner = Thread.currentThread()
          if (stopped) runner.interrupt() // asked before it started
        }
        try {
          val t0 = System.nanoTime()
          val written = write()
          (written, (System.nanoTime() - t0) / 1000000)
        } finally Write.this.synchronized { runner = null }
      }
    })

    /** Interrupts the write, as a task kill would if it ran on the task thread; never another
     *  write the same pool thread runs later (the pool clears the flag between tasks). */
    def interrupt(): Unit = synchronized {
      stopped = true
      if (runner != null) runner.interrupt()
    }
  }

  /**
   * The write's outcome once it is done, and whether the caller was interrupted meanwhile (its
   * flag is cleared; the caller sets it again when done). An interrupt (Spark killing the task)
   * is passed on to the write, as if it ran on the task thread, but the wait goes on until the
   * write has stopped: a commit never returns while its file may still be written.
   */
  def await(write: Write): (Either[Throwable, (Boolean, Long)], Boolean) = {
    var interrupted = false
    while (true) {
      try return (Right(write.task.get()), interrupted)
      catch {
        case _: InterruptedException => interrupted = true; write.interrupt()
        case e: ExecutionException => return (Left(e.getCause), interrupted)
      }
    }
    throw new IllegalStateException("unreachable")
  }
}

object StoreEngine {
  private val log = LoggerFactory.getLogger(classOf[StoreEngine])
  private val Json = new com.fasterxml.jackson.databind.ObjectMapper()
}
