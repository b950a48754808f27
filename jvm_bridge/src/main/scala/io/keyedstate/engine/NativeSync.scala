package io.keyedstate.engine

import java.nio.file.Path
import java.util.UUID

import scala.util.control.NonFatal

import org.slf4j.LoggerFactory

/**
 * The engine's native reader ([[NativeReader]]) and the version it shows: synced once per
 * version (Python finishes its pending applies and flushes, then the reader catches up). A
 * reader that cannot follow the server's RocksDB is closed, and reads go to the server. A sync
 * holds `lock` (the engine's monitor); `invalidate` makes the engine forget the version it holds
 * when the server holds another.
 */
private[engine] final class NativeSync(lock: AnyRef, session: ServerSession, describe: String,
    invalidate: () => Unit) {
  import NativeSync.log

  private var native: NativeReader = _ // null: native reads off or unavailable
  @volatile private var shows = -1L

  /** A fresh reader (none when native reads are off) for the store just (re)opened on a server. */
  def reopen(settings: StoreSettings, workDir: Path): Unit = {
    if (native != null) native.close()
    NativeReader.configure(settings.nativeBlockCacheBytes, settings.memoryBounded)
    native = if (!settings.nativeReads) null
      else new NativeReader(workDir.resolve("native").resolve(UUID.randomUUID().toString))
    shows = -1
  }

  /** The native reader showing `version`; null when reads go to the server. */
  def at(version: Long): NativeReader = {
    val reader = native
    if (reader == null || (shows == version && version >= 0)) reader else sync(version)
  }

  private def sync(version: Long): NativeReader = lock.synchronized {
    val reader = native
    if (reader == null || version < 0 || shows == version) reader
    else {
      val (held, dir) = session.data(s"syncing $describe")((c, h) => c.sync(h))
      if (held != version) {
        invalidate()
        throw new IllegalStateException(s"keyedstate: the state server holds version $held of $describe, expected $version")
      }
      try { reader.follow(dir); shows = version; reader } catch {
        case NonFatal(e) =>
          log.warn(s"keyedstate: cannot read $describe natively from $dir (RocksDB secondary instance); " +
            "its reads go through the state server", e)
          reader.close()
          native = null
          null
      }
    }
  }

  /** Shows no version: the next read syncs again. */
  def reset(): Unit = {
    shows = -1
    if (native != null) native.reset()
  }

  def close(): Unit = if (native != null) { native.close(); native = null }
}

private[engine] object NativeSync {
  private val log = LoggerFactory.getLogger(classOf[NativeSync])
}
