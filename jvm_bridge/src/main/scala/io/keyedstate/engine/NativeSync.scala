package io.keyedstate.engine

import java.nio.file.Path
import java.util.UUID
import java.util.concurrent.atomic.AtomicLong

import scala.util.control.NonFatal

import org.slf4j.LoggerFactory

/**
 * The engine's native reader ([[NativeReader]]) and the version it shows. A sync makes Python
 * finish its pending applies and flush, then the reader catches up; each flush adds a RocksDB
 * file, and every few files a compaction. So point reads do not sync per version: the
 * versions committed since the reader's (`shows`) keep their writes here, in the overlay, and a
 * point read consults it before the reader. A sync is due once the overlay outgrows
 * `nativeOverlayBytes` (or the overlays of all stores half the near cache's budget, in which
 * they are counted), and before a scan (which the overlay does not cover). A store whose near
 * cache holds every key reads nothing natively, so it keeps no overlay.
 *
 * A sync holds `lock` (the engine's monitor); `invalidate` makes the engine forget the version it
 * holds when the server holds another.
 */
private[engine] final class NativeSync(lock: AnyRef, session: ServerSession, describe: String,
    invalidate: () => Unit) {
  import NativeSync.log

  private var native: NativeReader = _ // null: native reads off or unavailable
  @volatile private var shows = -1L
  // Writes of the versions after `shows` through `overlaid` (-1: none shown); under `overlayLock`.
  private val overlayLock = new Object
  private var overlay: BytesMap = _
  @volatile private var overlaid = -1L
  private var overlayLimit = 0L
  private var charged = 0L // what the overlay adds to the near cache's budget
  /** Syncs with the server since last read (a metric). */
  val syncs = new AtomicLong

  /** A fresh reader (none when native reads are off) for the store just (re)opened on a server. */
  def reopen(settings: StoreSettings, workDir: Path): Unit = {
    if (native != null) native.close()
    NativeReader.configure(settings.nativeBlockCacheBytes, settings.memoryBounded)
    native = if (!settings.nativeReads) null
      else new NativeReader(workDir.resolve("native").resolve(UUID.randomUUID().toString))
    overlayLimit = settings.nativeOverlayBytes
    shows = -1
    dropOverlay()
  }

  /** The native reader, for point reads of `version` together with [[overlaidValue]]; null when
   *  reads go to the server. */
  def forGets(version: Long): NativeReader = {
    val reader = native
    if (reader == null || (overlaid == version && version >= 0)) reader else sync(version)
  }

  /** The native reader showing exactly `version` (no overlay), for scans; null as above. */
  def forScans(version: Long): NativeReader = {
    val reader = native
    if (reader == null || (shows == version && overlaid == version && version >= 0)) reader else sync(version)
  }

  /** A write to `key` since the reader's version: null when none, [[WriteBuffer.Tombstone]] for
   *  a delete. Call after [[forGets]] for the same version. */
  def overlaidValue(key: Bytes): Array[Byte] = overlayLock.synchronized {
    if (overlay == null) null else overlay.get(key.bytes, key.hashCode)
  }

  /**
   * `writes` made version `to` out of `from`. While the reader shows `from` (through the overlay)
   * and point reads may come (`cacheMisses`: the near cache does not hold every key), they join
   * the overlay if they fit its budget; otherwise the next read syncs.
   */
  def committed(from: Long, to: Long, writes: WriteBuffer, cacheMisses: Boolean): Unit = overlayLock.synchronized {
    if (native == null || overlaid != from || from < 0) return
    // Checked before the copy: a version's writes take about what they take in its buffer.
    if (!cacheMisses || overlayLimit <= 0 || charged + writes.entryBytes > overlayLimit ||
        !CacheBudget.overlaysFit(writes.entryBytes)) { dropOverlay(); return }
    if (overlay == null) { // pages from 4 KiB, doubling: a few writes a version stay small
      var pages = 0
      overlay = new BytesMap(() => { pages += 1; 4096 << math.min(pages - 1, 6) })
    }
    writes.foreachWrite((key, value) => overlay.put(key.bytes, key.hashCode, value))
    charge()
    if (charged > overlayLimit) dropOverlay() else overlaid = to
  }

  private def sync(version: Long): NativeReader = lock.synchronized {
    val reader = native
    if (reader == null || version < 0 || (shows == version && overlaid == version)) reader
    else {
      val (held, dir) = session.data(s"syncing $describe")((c, h) => c.sync(h))
      if (held != version) {
        invalidate()
        throw new IllegalStateException(s"keyedstate: the state server holds version $held of $describe, expected $version")
      }
      syncs.incrementAndGet()
      try {
        // A catch-up that fails (the primary removed a file the secondary's view still named)
        // is retried once as a fresh open, before reads go to the server for good.
        try reader.follow(dir) catch {
          case NonFatal(e) =>
            log.info(s"keyedstate: native reader of $describe could not catch up; reopening it", e)
            reader.reset()
            reader.follow(dir)
        }
        overlayLock.synchronized { dropOverlay(); shows = version; overlaid = version }
        reader
      } catch {
        case NonFatal(e) =>
          log.warn(s"keyedstate: cannot read $describe natively from $dir (RocksDB secondary instance); " +
            "its reads go through the state server", e)
          reader.close()
          native = null
          dropOverlay()
          null
      }
    }
  }

  private def charge(): Unit = {
    val now = if (overlay == null) 0L else overlay.memoryBytes
    CacheBudget.addOverlay(now - charged)
    charged = now
  }

  private def dropOverlay(): Unit = overlayLock.synchronized {
    overlay = null
    overlaid = -1
    charge()
  }

  /** Shows no version: the next read syncs again. */
  def reset(): Unit = {
    shows = -1
    dropOverlay()
    if (native != null) native.reset()
  }

  def close(): Unit = {
    dropOverlay()
    if (native != null) { native.close(); native = null }
  }
}

private[engine] object NativeSync {
  private val log = LoggerFactory.getLogger(classOf[NativeSync])
}
