package io.keyedstate.engine

import java.util.UUID
import java.util.concurrent.atomic.AtomicLong

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, StateStoreConf, StateStoreId}
import org.apache.spark.sql.types.StructType
import org.slf4j.LoggerFactory

import io.keyedstate.bridge.ServerLaunch
import io.keyedstate.checkpoint.CheckpointFiles
import io.keyedstate.format.{ChangelogFormat, KeyCodec}

/** What a commit produced: the new version, its changelog size, its TTL cleanup. */
final case class CommitResult(version: Long, changelogBytes: Long, ttlCleanedUp: Long, ttlCleanupMs: Long)

/** Where a commit's time went, in ms: encoding the changelog (and updating the near cache),
 *  writing it to the checkpoint, shipping it to Python. */
final case class CommitPhases(encodeMs: Long, writeMs: Long, shipMs: Long)

/** One version of the store, open for one task: its view (TTL over the version's own writes
 *  over the committed version) and the TTL "now" of its batch. */
final class StoreVersion(val version: Long, val buffered: BufferedVersion, val ttl: TtlView, val nowMs: Long) {
  def view: KeyValueView = ttl
}

/**
 * The storage engine of one store partition (Spark's `RocksDB` class is the model): the version
 * lifecycle. It alone knows which version is held -- by the state server's store, the near cache
 * and the native reader alike (`loaded`) -- and it invalidates all of them together. It loads
 * versions ([[VersionLoader]]), commits them (the changelog to the checkpoint first: that is the
 * commit; then shipped to the server in one frame), composes the read tiers ([[CommittedReads]])
 * and runs maintenance ([[SnapshotUploader]], cleanup).
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
  private val uploader = new SnapshotUploader(files, describe)
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

  // THE version held by the server's store, the near cache and (once synced) the native reader.
  @volatile private var loaded = -1L
  @volatile private var nativeShows = -1L
  @volatile private var closed = false
  @volatile var numKeys = 0L

  val loadMs = new AtomicLong
  val nativeGets = new AtomicLong
  @volatile var lastCommitPhases: CommitPhases = CommitPhases(0, 0, 0)

  /** Opens the store now, so that a bad conf fails the first task. */
  def open(): Unit = synchronized { ensureOpen() }

  def codec: KeyCodec = keyCodec
  def ttlPolicy: TtlPolicy = policy
  def nearCache: NearCache = cache
  def bytesUploaded: AtomicLong = uploader.bytesUploaded
  def filesUploaded: AtomicLong = uploader.filesUploaded
  def filesReused: AtomicLong = uploader.filesReused
  def holds(version: Long): Boolean = loaded == version && version >= 0

  private def ensureOpen(): Unit = if (session.ensureOpen()) {
    val settings = session.settings
    TtlPolicy.validateOverrides(settings.json, id, hadoopConf, ServerLaunch.ConfPrefix)
    policy = TtlPolicy.resolve(settings.json, id)
    keyCodec = new KeyCodec(keySchema, valueSchema, encoderSpec, id.storeName, settings.keyGroups)
    cleanup = new TtlCleanup(id, policy, () => keyCodec, describe)
    CacheBudget.configure(settings.nearCacheBytes)
    if (cache != null) cache.clear()
    cache = new NearCache(settings.bloomFpp)
    if (native != null) native.close()
    NativeReader.configure(settings.nativeBlockCacheBytes)
    native = if (!settings.nativeReads) null
      else new NativeReader(session.process.workDir.resolve("native").resolve(UUID.randomUUID().toString))
    val server = new ServerReads(session, () => session.settings.scanChunkBytes, describe)
    committedReads = new NativeReads(() => nativeAt(loaded), server, () => session.settings.scanChunkBytes, nativeGets)
    loaded = -1
    nativeShows = -1
  }

  private def requireOpen(): Unit =
    if (closed) throw new IllegalStateException(s"keyedstate provider for $describe is closed")

  /** Makes every tier hold `version` and opens it for one task. */
  def begin(version: Long, loadEmpty: Boolean, writable: () => Boolean): StoreVersion = synchronized {
    requireOpen()
    load(version, loadEmpty)
    val nowMs = if (policy.enabled) clock.now(version) else 0L
    val buffered = new BufferedVersion(version, new CachedReads(cache, committedReads), () => holds(version))
    new StoreVersion(version, buffered, new TtlView(buffered, policy, nowMs, writable), nowMs)
  }

  private def load(version: Long, loadEmpty: Boolean): Unit = {
    ensureOpen()
    if (loaded == version && !loadEmpty) {
      if (cache.bloomSaturated) CacheWarmer.indexKeys(cache, committedReads, numKeys)
      return
    }
    val started = System.nanoTime()
    invalidate() // until the load completes
    try {
      if (loadEmpty || version == 0) {
        loader.restoreEmpty(session, version)
        numKeys = 0
      } else numKeys = loader.load(session, version, session.settings.keyGroups, session.process.workDir)
      loaded = version
      CacheWarmer.warm(cache, committedReads, numKeys)
    } catch { case NonFatal(e) => invalidate(); throw e }
    loadMs.addAndGet((System.nanoTime() - started) / 1000000)
  }

  /**
   * Makes `v`'s writes version `v.version + 1`, durably: TTL cleanup adds its deletes, the near
   * cache takes each write and classifies it for the changelog (what the version's misses
   * learnt settles what it cannot), the changelog is written to the checkpoint (the commit),
   * then shipped to the server: applied behind when every write's previous existence was known
   * (so the key count is exact without waiting), else applied before the reply.
   */
  def commit(v: StoreVersion, forceSnapshot: Boolean): CommitResult = synchronized {
    requireOpen()
    if (loaded != v.version) {
      throw new IllegalStateException(s"keyedstate: $describe holds version $loaded, cannot commit on top of " +
        s"version ${v.version} (two stores of one partition were open at once)")
    }
    val newVersion = v.version + 1
    try {
      val (cleaned, cleanupMs) = cleanup.collect(session, v.buffered, newVersion, v.nowMs)
      val t0 = System.nanoTime()
      val learned = v.buffered.committed.learned
      var delta = 0L
      var unknown = 0L
      val changelog = ChangelogFormat.encode(newVersion, session.settings.keyGroups) { writer =>
        v.buffered.buffer.foreach { (key, value) =>
          val op = ChangelogFormat.settle(cache.commitWrite(key, value), learned.get(key))
          op match {
            case ChangelogFormat.OpPutNew => delta += 1
            case ChangelogFormat.OpDeleteExisting => delta -= 1
            case ChangelogFormat.OpPut | ChangelogFormat.OpDelete => unknown += 1
            case _ =>
          }
          if (op != 0) { if (value eq WriteBuffer.Tombstone) writer.delete(op, key.bytes) else writer.put(op, key.bytes, value) }
        }
      }
      loaded = -1 // until the version is durable and shipped
      val bytes = changelog.remaining().toLong
      val t1 = System.nanoTime()
      files.ensureDirs()
      files.writeAtomically(files.changelog(newVersion), changelog.duplicate())
      val t2 = System.nanoTime()
      val behind = session.settings.writeBehind && unknown == 0 && !forceSnapshot
      val counted = session.data(s"committing version $newVersion of $describe")(
        (c, h) => c.apply(h, changelog, behind, cleanup.scanRequest(v.nowMs)))
      numKeys = if (behind) numKeys + delta else counted
      if (forceSnapshot) session.control("staging a snapshot")((api, h) => api.stageSnapshot(h))
      val t3 = System.nanoTime()
      loaded = newVersion
      lastCommitPhases = CommitPhases((t1 - t0) / 1000000, (t2 - t1) / 1000000, (t3 - t2) / 1000000)
      CommitResult(newVersion, bytes, cleaned, cleanupMs)
    } catch {
      case NonFatal(e) => invalidate(); throw e
    }
  }

  /** The committed value of `key` if this engine holds `version` (Some(null) = absent), for a
   *  sibling store's cleanup; None when it holds another version. */
  def committedValue(key: Bytes, version: Long): Option[Array[Byte]] = synchronized {
    if (closed || loaded != version) None else Some(new CachedReads(cache, committedReads).get(key))
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

  /** Forget the version held: the next task reloads it from the checkpoint. */
  def invalidate(): Unit = synchronized {
    loaded = -1
    nativeShows = -1
    if (cache != null) cache.clear()
    if (native != null) native.reset()
  }

  /** RocksDB memory of the store in the server (0 when unknown); never waits for an apply. */
  def serverMemoryBytes(): Long =
    if (closed || !session.isAlive) 0L
    else try session.maintenance("reading store memory")((api, h) => api.memoryBytes(h)).toLong catch { case NonFatal(_) => 0L }

  /** Uploads the snapshots the server staged (maintenance thread). */
  def uploadSnapshots(): Unit = {
    if (closed || !session.isAlive || keyCodec == null) return
    maintenanceMutex.synchronized {
      uploader.upload(session, session.settings.keyGroups, keyCodec.layout,
        if (policy.enabled) Some(policy.describe) else None)
    }
  }

  /** Deletes what no retained version needs (maintenance thread). */
  def cleanupFiles(): Unit = maintenanceMutex.synchronized {
    if (closed) return
    val deleted = files.cleanup(storeConf.minVersionsToRetain)
    if (deleted > 0) log.info(s"keyedstate: cleanup deleted $deleted files of $describe")
  }

  def close(): Unit = synchronized {
    if (closed) return
    closed = true
    if (cache != null) cache.clear()
    if (native != null) { native.close(); native = null }
    session.close()
  }
}

object StoreEngine {
  private val log = LoggerFactory.getLogger(classOf[StoreEngine])
  private val Json = new com.fasterxml.jackson.databind.ObjectMapper()
}
