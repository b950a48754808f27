package io.keyedstate.spark

import java.nio.file.{Files, Paths}
import java.util.UUID
import java.util.concurrent.atomic.AtomicLong

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.hadoop.conf.Configuration
import org.apache.spark.SparkEnv
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType
import org.slf4j.LoggerFactory

import io.keyedstate.bridge.{ServerLaunch, StateServerProcess, TtlScan}

/**
 * keyedstate's StateStoreProvider: Spark's contract only. Storage lives in the Python state
 * server (one per executor JVM, see [[StateServerProcess]]); checkpoint files in
 * [[CheckpointFiles]]; byte layouts in [[KeyCodec]]; a version's writes in [[WriteBuffer]].
 *
 * Versions: the Python store holds exactly one committed version. getStore(v) reuses it when
 * this provider committed or loaded v last; otherwise it reloads v from the checkpoint
 * (nearest snapshot at or below v, then changelogs), so any executor can load any version.
 * commit() writes the changelog to the checkpoint (the durable commit), then ships the same
 * bytes to Python in one frame, then reports to the coordinator. abort() drops the buffer.
 */
class KeyedStateProvider extends StateStoreProvider {
  import KeyedStateProvider._

  private var storeId: StateStoreId = _
  private var keySchema: StructType = _
  private var valueSchema: StructType = _
  private var encoderSpec: KeyStateEncoderSpec = _
  private var storeConf: StateStoreConf = _
  private var hadoopConf: Configuration = _
  private var launch: ServerLaunch = _
  private var confsJson: String = _
  private[spark] var files: CheckpointFiles = _

  // The Python-side store this provider drives; guarded by `this`.
  private var server: StateServerProcess = _
  private var handle: Int = -1
  private[spark] var keyGroups: Int = _
  private[spark] var scanChunkBytes: Int = _
  @volatile private[spark] var ttl: TtlPolicy = _
  private var writeBehind = true
  private[spark] var cache: NearCache = _
  // Serves near-cache misses and scans from Python's RocksDB files without a round trip;
  // null when the nativeReads conf is off or the files could not be opened.
  @volatile private var native: NativeReader = _
  private var loadedVersion: Long = -1
  private[spark] var numKeys: Long = 0
  // Snapshot files this provider uploaded or loaded, per RocksDB lineage: (name, size) -> path.
  private var uploaded: Map[(String, Long), String] = Map.empty
  private var uploadedLineage: String = ""
  // Lock order: the provider's monitor may be taken while holding neither of these; these two
  // never wait for the provider's monitor (maintenance reads what it needs from it first).
  private val maintenanceMutex = new Object // snapshot upload vs cleanup
  private val lineageLock = new Object      // `lineage`, `uploaded`, `uploadedLineage`
  @volatile private var closed = false

  private[spark] val metricLoadMs = new AtomicLong
  private[spark] val metricNativeGets = new AtomicLong
  private[spark] val metricSnapshotBytes = new AtomicLong
  private[spark] val metricFilesUploaded = new AtomicLong
  private[spark] val metricFilesReused = new AtomicLong
  @volatile private[spark] var lastCommitPhases = CommitPhases(0, 0, 0)

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConfs: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    if (useColumnFamilies || useMultipleValuesPerKey) {
      throw new UnsupportedOperationException(
        "keyedstate does not support column families or multiple values per key (only " +
          "transformWithState uses them, and Spark runs it only on RocksDBStateStoreProvider)")
    }
    if (storeConfs.stateStoreCheckpointFormatVersion > 1) {
      throw new UnsupportedOperationException(
        "keyedstate supports spark.sql.streaming.stateStore.checkpointFormatVersion=1 only; " +
          s"this query uses ${storeConfs.stateStoreCheckpointFormatVersion}")
    }
    this.storeId = stateStoreId
    this.keySchema = keySchema
    this.valueSchema = valueSchema
    this.encoderSpec = keyStateEncoderSpec
    this.storeConf = storeConfs
    this.hadoopConf = hadoopConf
    val confs = storeConfs.sqlConfs.filter(_._1.startsWith(ConfPrefix))
    this.confsJson = Json.writeValueAsString(confs.asJava)
    this.launch = serverLaunch(confs)
    this.files = new CheckpointFiles(stateStoreId.storeCheckpointLocation(), hadoopConf)
    synchronized { ensureOpen() } // validates the confs now: a bad value fails the first task
    KeyedStateProvider.live.put(stateStoreId, this)
  }

  override def stateStoreId: StateStoreId = storeId

  private def describe: String =
    s"operator ${storeId.operatorId} partition ${storeId.partitionId} store '${storeId.storeName}' " +
      s"(${storeId.storeCheckpointLocation()})"

  /** Opens our store on the live server, reopening after a server restart. */
  private def ensureOpen(): StateServerProcess = {
    val live = StateServerProcess.get(launch, storeId.partitionId)
    if (live ne server) {
      val settings = Json.readTree(live.control(s"opening $describe")(_.openStore(storeId.toString, confsJson)))
      server = live
      handle = settings.get("handle").asInt()
      keyGroups = settings.get("keyGroups").asInt()
      scanChunkBytes = settings.get("scanChunkBytes").asInt()
      TtlPolicy.validateOverrides(settings, storeId, hadoopConf)
      ttl = TtlPolicy.resolve(settings, storeId)
      writeBehind = settings.get("writeBehind").asBoolean()
      CacheBudget.configure(settings.get("nearCacheBytes").asLong())
      if (cache != null) cache.clear()
      cache = new NearCache(settings.get("bloomFpp").asDouble())
      if (native != null) native.close()
      NativeReader.configure(settings.get("nativeBlockCacheBytes").asLong())
      native = if (settings.get("nativeReads").asBoolean())
        new NativeReader(live.workDir.resolve("native").resolve(UUID.randomUUID().toString)) else null
      loadedVersion = -1
    }
    server
  }

  override def getStore(version: Long, uniqueId: Option[String], forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore = synchronized {
    requireOpen()
    load(version, loadEmpty)
    val now = if (ttl.enabled) TtlClock.now(storeId, version, hadoopConf) else 0L
    new KeyedStateStore(this, version, forceSnapshotOnCommit, now)
  }

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore =
    getStore(version, uniqueId, forceSnapshotOnCommit = false, loadEmpty = false)

  /** Aggregations open a read store and then a write store on the same version: reuse it. */
  override def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long,
      uniqueId: Option[String], forceSnapshotOnCommit: Boolean): StateStore = readStore match {
    case s: KeyedStateStore if s.version == version && !s.hasCommitted => s
    case other =>
      other.release()
      getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty = false)
  }

  private def requireOpen(): Unit =
    if (closed) throw new IllegalStateException(s"keyedstate provider for $describe is closed")

  /** Makes the Python store hold `version`. */
  private def load(version: Long, loadEmpty: Boolean): Unit = {
    val live = ensureOpen()
    if (loadedVersion == version && cache.version == version && !loadEmpty) {
      if (cache.bloomSaturated) warmCache(version, valuesToo = false)
      return
    }
    val started = System.nanoTime()
    loadedVersion = -1 // until the load completes
    cache.clear()
    if (native != null) native.reset() // Python replaces the directory
    if (loadEmpty || version == 0) {
      live.control(s"loading version $version of $describe")(_.restore(handle, version, null, newLineage(Nil), 0))
    } else {
      val listing = files.listing()
      val base = listing.snapshots.filter(_ <= version).lastOption
      val needed = (base.getOrElse(0L) + 1 to version)
      val missing = needed.filterNot(listing.changelogs.contains)
      if (missing.nonEmpty) {
        val foreign = if (listing.foreign.isEmpty) "" else
          s" The directory holds files of another state store provider (${listing.foreign.take(5).mkString(", ")}): " +
            "this checkpoint was not written by keyedstate; restart the query with the provider that wrote it."
        throw new CheckpointFileException(
          s"keyedstate: cannot load version $version of $describe: missing " +
            s"${missing.take(3).map(files.changelog).mkString(", ")}${if (missing.size > 3) " ..." else ""}.$foreign")
      }
      val localRoot = Files.createDirectories(live.workDir.resolve("restore").resolve(UUID.randomUUID().toString))
      try {
        base match {
          case Some(s) =>
            val manifest = files.readManifest(s)
            checkKeyGroups(manifest.keyGroups, files.manifest(s).toString)
            val snapDir = Files.createDirectories(localRoot.resolve("snapshot"))
            manifest.files.foreach(f => files.download(files.resolve(f.path), snapDir.resolve(f.name)))
            val id = newLineage(manifest.files)
            manifest.replay match {
              case None =>
                live.control(s"restoring snapshot ${files.manifest(s)}")(_.restore(handle, s, snapDir.toString, id, manifest.numKeys))
              case Some(r) => // the files as version s - 1, then the version itself as a changelog
                val base = if (manifest.files.isEmpty) null else snapDir.toString
                live.control(s"restoring snapshot ${files.manifest(s)}")(_.restore(handle, s - 1, base, id, 0))
                val local = localRoot.resolve(r.name)
                files.download(files.resolve(r.path), local)
                val listJson = Json.writeValueAsString(java.util.List.of(
                  java.util.List.of(Long.box(s), local.toString, files.resolve(r.path).toString)))
                live.control(s"replaying ${files.resolve(r.path)}")(_.replay(handle, listJson))
                Files.deleteIfExists(local)
            }
          case None =>
            live.control(s"loading version $version of $describe")(_.restore(handle, 0, null, newLineage(Nil), 0))
        }
        // Replay in groups so that local disk holds a bounded number of changelog copies.
        needed.grouped(32).foreach { group =>
          val locals = group.map { v =>
            val local = localRoot.resolve(s"$v.ks-changelog")
            files.download(files.changelog(v), local)
            (v, local)
          }
          val listJson = Json.writeValueAsString(locals.map { case (v, p) =>
            java.util.List.of(Long.box(v), p.toString, files.changelog(v).toString)
          }.asJava)
          live.control(s"replaying changelogs ${group.head}..${group.last} of $describe")(_.replay(handle, listJson))
          locals.foreach { case (_, p) => Files.deleteIfExists(p) }
        }
      } finally deleteTree(localRoot)
      numKeys = Json.readTree(live.control("reading store info")(_.storeInfo(handle))).get("numKeys").asLong()
    }
    if (version == 0 || loadEmpty) numKeys = 0
    warmCache(version, valuesToo = true)
    cache.version = version
    loadedVersion = version
    metricLoadMs.addAndGet((System.nanoTime() - started) / 1000000)
  }

  /**
   * Streams the loaded version into the near cache: values while the budget lasts (the cache
   * stays complete if they all fit), then keys only, into the Bloom filter.
   */
  private def warmCache(version: Long, valuesToo: Boolean): Unit = {
    var after: Array[Byte] = null
    var more = true
    if (valuesToo) {
      cache.clear()
      cache.complete = true // provisional: every key seen so far is cached
      while (more && cache.complete) {
        val chunk = chunkAt(version, Array.emptyByteArray, after, keysOnly = false, s"loading $describe into the near cache")
        var i = 0
        while (i < chunk.keys.length) { cache.put(new Bytes(chunk.keys(i)), chunk.values(i)); i += 1 }
        more = chunk.hasMore
        if (chunk.keys.nonEmpty) after = chunk.keys.last
      }
      if (!more) return
    } else {
      cache.startBloom(math.max(NearCache.MinBloomCapacity, 2L * numKeys))
      after = null
    }
    if (!valuesToo) cache.complete = false
    while (more) {
      val chunk = chunkAt(version, Array.emptyByteArray, after, keysOnly = true, s"indexing $describe")
      chunk.keys.foreach(cache.addToBloom)
      more = chunk.hasMore
      if (chunk.keys.nonEmpty) after = chunk.keys.last
    }
  }

  private def checkKeyGroups(found: Int, file: String): Unit =
    if (found != keyGroups) {
      throw new CheckpointFileException(
        s"keyedstate: $file was written with keyGroups=$found but this query sets " +
          s"${ConfPrefix}keyGroups=$keyGroups; the key-group count is fixed for a checkpoint")
    }

  private def newLineage(files: Seq[SnapshotFile]): String = {
    val id = UUID.randomUUID().toString
    lineageLock.synchronized {
      uploadedLineage = id
      uploaded = files.map(f => (f.name, f.size) -> f.path).toMap
    }
    id
  }

  /**
   * Called by the store: make `buffer` version `newVersion`, durably. The changelog is written
   * to the checkpoint first (that is the commit); then it is shipped to Python in one frame,
   * applied behind when the near cache knew every key's previous existence (so the key count
   * is exact without waiting), and the near cache takes the writes.
   */
  private[spark] def commitVersion(version: Long, buffer: WriteBuffer, forceSnapshot: Boolean,
      fetched: java.util.Map[Bytes, java.lang.Boolean], nowMs: Long): CommitResult = synchronized {
    requireOpen()
    if (loadedVersion != version || cache.version != version) {
      throw new IllegalStateException(
        s"keyedstate: $describe holds version $loadedVersion, cannot commit on top of version $version " +
          "(two stores of one partition were open at once)")
    }
    val newVersion = version + 1
    try {
      val (cleaned, cleanupMs) =
        if (ttl.enabled) cleanupExpired(version, newVersion, buffer, fetched, nowMs) else (0L, 0L)
      val t0 = System.nanoTime()
      var unknown = 0
      var delta = 0L
      // One pass: the near cache takes each write and classifies it for the changelog; what the
      // version's own round trips learnt (`fetched`: key -> existed) settles what it cannot.
      val changelog = buffer.toChangelog(newVersion, keyGroups, (key, value) => {
        val op = WriteBuffer.settle(cache.commitWrite(key, value), fetched.get(key))
        op match {
          case WriteBuffer.OpPutNew => delta += 1
          case WriteBuffer.OpDeleteExisting => delta -= 1
          case WriteBuffer.OpPut | WriteBuffer.OpDelete => unknown += 1
          case _ =>
        }
        op
      })
      cache.version = -1 // until the version is durable and shipped
      loadedVersion = -1
      val bytes = changelog.remaining().toLong
      val t1 = System.nanoTime()
      files.ensureDirs()
      files.writeAtomically(files.changelog(newVersion), changelog.duplicate())
      val t2 = System.nanoTime()
      val behind = writeBehind && unknown == 0 && !forceSnapshot
      val scan = if (ttl.enabled) Some(TtlScan(nowMs - ttl.ttlMs, ttl.cleanupInterval, ttl.cleanupKeysPerScan)) else None
      val counted = server.withChannel(s"committing version $newVersion of $describe")(_.apply(handle, changelog, behind, scan))
      numKeys = if (behind) numKeys + delta else counted
      if (forceSnapshot) server.control("staging a snapshot")(_.stageSnapshot(handle))
      val t3 = System.nanoTime()
      cache.version = newVersion
      loadedVersion = newVersion
      lastCommitPhases = CommitPhases((t1 - t0) / 1000000, (t2 - t1) / 1000000, (t3 - t2) / 1000000)
      CommitResult(newVersion, bytes, cleaned, cleanupMs)
    } catch {
      case NonFatal(e) => invalidate(); throw e
    }
  }

  /**
   * Incremental TTL cleanup, part of the commit. Every ttl.cleanupInterval versions, after
   * the apply, the Python server walks a bounded number of entries (in the background, see
   * store.py) and remembers the expired ones; a later commit deletes them through its
   * changelog, so every reload and every executor agrees on the state. The commit never waits
   * for a scan: it takes the last finished one. Keys scanned in exactly the version it commits
   * on cannot have changed except through this version's own writes; keys from an older scan
   * are checked again against the committed values (near cache, else one multi-get). For a
   * join's index store the rows found are only candidates: a row is garbage when the join
   * key's count, in the sibling count store committed just before in the same task, is gone,
   * expired or no longer covers the row's index. Returns (entries deleted, ms).
   */
  private def cleanupExpired(version: Long, newVersion: Long, buffer: WriteBuffer,
      fetched: java.util.Map[Bytes, java.lang.Boolean], nowMs: Long): (Long, Long) = {
    val started = System.nanoTime()
    val found = server.withChannel(s"fetching TTL cleanup candidates of $describe")(_.ttlCandidates(handle))
    if (found.version < 0 || found.version > version || found.keys.isEmpty) return (0L, found.scanMs.toLong)
    val expireBefore = nowMs - ttl.ttlMs
    val keys = found.keys.map(new Bytes(_)).filter(buffer.lookup(_) == null)
    // Still there, and (per-entry TTL) still expired, in the version this commit builds on?
    val current: Array[Array[Byte]] =
      if (found.version == version) null else lookupCommittedMany(keys, fetched)
    def stillExpired(i: Int): Boolean = current == null ||
      (current(i) != null && (!ttl.perEntry || codec.isExpired(current(i), expireBefore)))
    val isGarbage: Array[Byte] => Boolean = ttl.countStore match {
      case None => _ => true
      case Some(countStoreName) =>
        val sibling = KeyedStateProvider.live.get(storeId.copy(storeName = countStoreName))
        if (sibling == null) return (0L, found.scanMs.toLong)
        key => {
          val (countKey, index) = codec.countKeyAndIndex(key)
          sibling.committedValue(new Bytes(countKey), newVersion) match {
            case None => return (0L, found.scanMs.toLong) // the count store is elsewhere: next time
            case Some(null) => true
            case Some(count) =>
              sibling.codec.isExpired(count, expireBefore) || sibling.codec.decodeValue(count).getLong(0) <= index
          }
        }
    }
    var cleaned = 0L
    var i = 0
    while (i < keys.length) {
      if (stillExpired(i) && isGarbage(keys(i).bytes)) {
        buffer.delete(keys(i))
        fetched.put(keys(i), java.lang.Boolean.TRUE) // it exists: the commit counts the delete exactly
        cleaned += 1
      }
      i += 1
    }
    (cleaned, found.scanMs + (System.nanoTime() - started) / 1000000)
  }

  /** [[lookupCommitted]] for many keys: near cache, then one round trip for the rest. */
  private def lookupCommittedMany(keys: Array[Bytes], fetched: java.util.Map[Bytes, java.lang.Boolean]): Array[Array[Byte]] = {
    val out = new Array[Array[Byte]](keys.length)
    val missing = scala.collection.mutable.ArrayBuffer.empty[Int]
    var i = 0
    while (i < keys.length) {
      val cached = cache.lookup(keys(i))
      if (cached eq NearCache.Absent) out(i) = null
      else if (cached != null) out(i) = cached
      else missing += i
      i += 1
    }
    if (missing.nonEmpty) {
      val reader = nativeAt(loadedVersion)
      val values = if (reader != null) {
        metricNativeGets.addAndGet(missing.size)
        missing.map(i => reader.get(keys(i).bytes)).toArray
      } else try server.withChannel(s"reading $describe")(_.multiGet(handle, missing.map(keys(_).bytes).toArray))
      catch { case NonFatal(e) => invalidate(); throw e }
      missing.indices.foreach { j =>
        val k = keys(missing(j))
        out(missing(j)) = values(j)
        if (values(j) != null) cache.put(k, values(j))
        fetched.put(k, values(j) != null)
      }
    }
    out
  }

  /**
   * The committed value of `key` if this provider holds `version` (Some(null) = absent), for a
   * sibling store's cleanup; None when it holds another version.
   */
  private[spark] def committedValue(key: Bytes, version: Long): Option[Array[Byte]] = synchronized {
    if (closed || loadedVersion != version || cache.version != version) None
    else Some(lookupCommitted(key, new java.util.HashMap[Bytes, java.lang.Boolean]()))
  }

  /**
   * The committed value of `key` in the loaded version: near cache, else one round trip, whose
   * answer (exists or not) is also recorded in `fetched` for the commit to use.
   */
  private[spark] def lookupCommitted(key: Bytes, fetched: java.util.Map[Bytes, java.lang.Boolean]): Array[Byte] = {
    val cached = cache.lookup(key)
    if (cached eq NearCache.Absent) null
    else if (cached != null) cached
    else {
      val reader = nativeAt(loadedVersion)
      val value = if (reader != null) { metricNativeGets.incrementAndGet(); reader.get(key.bytes) }
        else try server.withChannel(s"reading $describe")(_.get(handle, key.bytes)) catch {
          case NonFatal(e) => invalidate(); throw e
        }
      if (value != null) cache.put(key, value)
      fetched.put(key, value != null)
      value
    }
  }

  /**
   * The native reader showing `version` (Python's files, synced once per version: Python
   * finishes its pending applies and flushes, then the reader catches up), or null when reads
   * go to Python: native reads are off, or the files could not be opened (logged once).
   */
  private def nativeAt(version: Long): NativeReader = {
    val reader = native
    if (reader == null || (reader.version == version && version >= 0)) reader else syncNative(version)
  }

  private def syncNative(version: Long): NativeReader = synchronized {
    val reader = native
    if (reader == null || version < 0 || reader.version == version) reader
    else {
      val (held, dir) = try server.withChannel(s"syncing $describe")(_.sync(handle)) catch {
        case NonFatal(e) => invalidate(); throw e
      }
      if (held != version) {
        invalidate()
        throw new IllegalStateException(s"keyedstate: the state server holds version $held of $describe, expected $version")
      }
      try { reader.follow(dir, held); reader } catch {
        case NonFatal(e) =>
          log.warn(s"keyedstate: cannot read $describe natively from $dir (RocksDB secondary instance); " +
            "its reads go through the state server", e)
          reader.close()
          native = null
          null
      }
    }
  }

  /** After a failed exchange with Python: the next getStore reloads from the checkpoint. */
  private def invalidate(): Unit = synchronized {
    loadedVersion = -1
    if (cache != null) cache.version = -1
    if (native != null) native.reset()
  }

  private[spark] def memoryUsedBytes(): Long = synchronized {
    if (server == null || !server.isAlive) 0L
    else try server.control("reading store memory")(_.memoryBytes(handle)).toLong catch { case NonFatal(_) => 0L }
  }

  private[spark] def scanChunk(prefix: Array[Byte], startAfter: Array[Byte]) =
    chunkAt(loadedVersion, prefix, startAfter, keysOnly = false, s"scanning $describe")

  /** A chunk of `version`'s entries with `prefix` after `startAfter`: natively, else from Python. */
  private def chunkAt(version: Long, prefix: Array[Byte], startAfter: Array[Byte], keysOnly: Boolean,
      what: String): io.keyedstate.bridge.ScanChunk = {
    val reader = nativeAt(version)
    if (reader != null) reader.scan(prefix, startAfter, scanChunkBytes, keysOnly)
    else try server.withChannel(what)(_.scan(handle, prefix, startAfter, scanChunkBytes, keysOnly))
    catch { case NonFatal(e) => invalidate(); throw e }
  }

  private var codecHolder: KeyCodec = _
  /** Per provider; only the task thread uses it. */
  private[spark] def codec: KeyCodec = {
    if (codecHolder == null) {
      codecHolder = new KeyCodec(keySchema, valueSchema, encoderSpec, storeId.storeName, keyGroups)
    }
    codecHolder
  }
  private[spark] def hadoopConfiguration: Configuration = hadoopConf
  private[spark] def id: StateStoreId = storeId

  /** Uploads staged snapshots: only files not uploaded before, then the manifest. */
  override def doSnapshotMaintenance(): Unit = {
    val (live, h) = synchronized { (server, handle) }
    if (closed || live == null || !live.isAlive) return
    maintenanceMutex.synchronized(uploadStaged(live, h))
  }

  private def uploadStaged(live: StateServerProcess, h: Int): Unit = {
    val staged = Json.readTree(live.control("listing staged snapshots")(_.stagedSnapshots(h)))
    staged.elements().asScala.foreach { snap =>
      val version = snap.get("version").asLong()
      val (sameLineage, known) = lineageLock.synchronized {
        (snap.get("lineage").asText() == uploadedLineage, uploaded)
      }
      try {
        val dir = Paths.get(snap.get("dir").asText())
        val entries = snap.get("files").elements().asScala.map { f =>
          val name = f.get("name").asText()
          val size = f.get("size").asLong()
          val reusable = if (sameLineage && name.endsWith(".sst")) known.get((name, size)) else None
          val path = reusable.getOrElse {
            val (rel, target) = files.newSnapshotFilePath(name)
            files.upload(dir.resolve(name), target)
            metricSnapshotBytes.addAndGet(size)
            metricFilesUploaded.incrementAndGet()
            rel
          }
          if (reusable.isDefined) metricFilesReused.incrementAndGet()
          SnapshotFile(name, path, size)
        }.toSeq
        files.writeManifest(SnapshotManifest(version, keyGroups, snap.get("numKeys").asLong(), entries,
          if (ttl != null && ttl.enabled) Some(ttl.describe) else None))
        lineageLock.synchronized {
          if (snap.get("lineage").asText() == uploadedLineage) {
            uploaded ++= entries.filter(_.name.endsWith(".sst")).map(f => (f.name, f.size) -> f.path)
          }
        }
        log.info(s"keyedstate: uploaded snapshot of version $version of $describe " +
          s"(${entries.size} files, ${entries.count(e => !known.get((e.name, e.size)).contains(e.path))} new)")
      } catch {
        case NonFatal(e) => log.warn(s"keyedstate: snapshot upload of version $version of $describe failed; will retry later", e)
          return
      } finally {
        // Either uploaded or failed; a failed staged copy is dropped too (the changelogs stay).
        try live.control("dropping a staged snapshot")(_.dropStaged(h, version)) catch { case NonFatal(_) => }
      }
    }
  }

  override def doCleanupMaintenance(): Unit = maintenanceMutex.synchronized {
    if (closed) return
    val deleted = files.cleanup(storeConf.minVersionsToRetain)
    if (deleted > 0) log.info(s"keyedstate: cleanup deleted $deleted files of $describe")
  }

  override def doMaintenance(): Unit = { doSnapshotMaintenance(); doCleanupMaintenance() }

  override def close(): Unit = synchronized {
    if (closed) return
    closed = true
    KeyedStateProvider.live.remove(storeId, this)
    if (cache != null) cache.clear()
    if (native != null) { native.close(); native = null }
    if (server != null && server.isAlive && handle >= 0) {
      try server.control("closing a store")(_.closeStore(handle))
      catch { case NonFatal(e) => log.warn(s"keyedstate: closing $describe failed", e) }
    }
    server = null
  }

  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] = CustomMetrics.all
}

object KeyedStateProvider {
  private val log = LoggerFactory.getLogger(classOf[KeyedStateProvider])
  private[spark] val Json = new ObjectMapper()
  /** Open providers of this JVM, so that a join's index store can consult its count store. */
  private[spark] val live = new java.util.concurrent.ConcurrentHashMap[StateStoreId, KeyedStateProvider]()
  val ConfPrefix = "spark.sql.streaming.stateStore.keyedstate."

  /** The knobs the JVM needs before the Python server exists (Python validates them too). */
  private def serverLaunch(confs: Map[String, String]): ServerLaunch = {
    val sparkConf = Option(SparkEnv.get).map(_.conf)
    // Same Python as the query's PySpark workers first; then our own knob (which
    // keyedstate.configure() sets to the driver's interpreter); then python3.
    val python = sparkConf.flatMap(_.getOption("spark.pyspark.python"))
      .orElse(sys.env.get("PYSPARK_PYTHON"))
      .orElse(confs.get(ConfPrefix + "pythonExec"))
      .getOrElse("python3")
    val processes = confs.get(ConfPrefix + "serverProcesses").flatMap(_.trim.toIntOption).filter(_ > 0)
      .orElse(sparkConf.flatMap(_.getOption("spark.executor.cores")).flatMap(_.toIntOption))
      .getOrElse(Runtime.getRuntime.availableProcessors())
    ServerLaunch(python, confs.get(ConfPrefix + "localDir"),
      durationMs(confs, "serverStartupTimeout", 60000L),
      math.min(Int.MaxValue.toLong, durationMs(confs, "bridgeTimeout", 600000L)).toInt,
      processes)
  }

  private def durationMs(confs: Map[String, String], name: String, default: Long): Long =
    confs.get(ConfPrefix + name).map { raw =>
      val m = """\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*""".r
      raw.toLowerCase match {
        case m(n, unit) if Units.contains(unit) => (n.toDouble * Units(unit)).toLong
        case _ => throw new IllegalArgumentException(
          s"Invalid value '$raw' for conf '$ConfPrefix$name': expected a duration such as 500ms, 30s, 15m, 24h or 7d")
      }
    }.getOrElse(default)

  private[spark] def deleteTree(path: java.nio.file.Path): Unit =
    if (Files.exists(path)) {
      val stream = Files.walk(path)
      try stream.sorted(java.util.Comparator.reverseOrder()).forEach(p => Files.deleteIfExists(p))
      finally stream.close()
    }

  private val Units = Map("ms" -> 1L, "s" -> 1000L, "sec" -> 1000L, "m" -> 60000L, "min" -> 60000L,
    "h" -> 3600000L, "d" -> 86400000L)
}

/** Where a commit's time went, in ms: encoding the changelog (and updating the near cache),
 *  writing it to the checkpoint, shipping it to Python. */
final case class CommitPhases(encodeMs: Long, writeMs: Long, shipMs: Long)

/** What a commit produced: the new version, its changelog size, and its TTL cleanup. */
final case class CommitResult(version: Long, changelogBytes: Long, ttlCleanedUp: Long, ttlCleanupMs: Long)

/** Custom metrics shown in `lastProgress.stateOperators[].customMetrics`. */
object CustomMetrics {
  val commitLatency = StateStoreCustomTimingMetric("keyedstateCommitLatencyMs", "keyedstate: commit time")
  val loadLatency = StateStoreCustomTimingMetric("keyedstateLoadLatencyMs", "keyedstate: version load time")
  val changelogBytes = StateStoreCustomSizeMetric("keyedstateChangelogBytes", "keyedstate: changelog bytes committed")
  val writesShipped = StateStoreCustomSumMetric("keyedstateWritesShipped", "keyedstate: keys written per commit")
  val bridgeGets = StateStoreCustomSumMetric("keyedstateBridgeGets", "keyedstate: reads that crossed to Python")
  val nativeGets = StateStoreCustomSumMetric("keyedstateNativeGets", "keyedstate: near-cache misses read from RocksDB's files in the JVM")
  val snapshotBytes = StateStoreCustomSizeMetric("keyedstateSnapshotBytesUploaded", "keyedstate: snapshot bytes uploaded")
  val filesUploaded = StateStoreCustomSumMetric("keyedstateSnapshotFilesUploaded", "keyedstate: snapshot files uploaded")
  val filesReused = StateStoreCustomSumMetric("keyedstateSnapshotFilesReused", "keyedstate: snapshot files reused")
  val cacheHits = StateStoreCustomSumMetric("keyedstateCacheHits", "keyedstate: reads answered by the near cache")
  val cacheAbsent = StateStoreCustomSumMetric("keyedstateCacheAbsent", "keyedstate: reads answered 'absent' locally (complete cache or Bloom filter)")
  val cacheEvictions = StateStoreCustomSumMetric("keyedstateCacheEvictions", "keyedstate: near-cache evictions")
  val cacheBytes = StateStoreCustomSizeMetric("keyedstateCacheBytes", "keyedstate: near-cache bytes")
  val bloomBytes = StateStoreCustomSizeMetric("keyedstateBloomBytes", "keyedstate: Bloom filter bytes")
  val commitEncode = StateStoreCustomTimingMetric("keyedstateCommitEncodeMs", "keyedstate: commit, encoding the changelog and updating the near cache")
  val commitWrite = StateStoreCustomTimingMetric("keyedstateCommitWriteMs", "keyedstate: commit, writing the changelog to the checkpoint")
  val commitShip = StateStoreCustomTimingMetric("keyedstateCommitShipMs", "keyedstate: commit, shipping the changelog to Python")
  val ttlExpired = StateStoreCustomSumMetric("keyedstateTtlExpired", "keyedstate: expired entries hidden from reads and scans")
  val ttlCleanedUp = StateStoreCustomSumMetric("keyedstateTtlCleanedUp", "keyedstate: expired entries deleted by cleanup")
  val ttlCleanupMs = StateStoreCustomTimingMetric("keyedstateTtlCleanupMs", "keyedstate: commit, TTL cleanup time")
  val all: Seq[StateStoreCustomMetric] =
    Seq(commitLatency, loadLatency, changelogBytes, writesShipped, bridgeGets, nativeGets, snapshotBytes, filesUploaded,
      filesReused, cacheHits, cacheAbsent, cacheEvictions, cacheBytes, bloomBytes, commitEncode, commitWrite,
      commitShip, ttlExpired, ttlCleanedUp, ttlCleanupMs)
}
