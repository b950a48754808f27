package io.keyedstate.engine

import scala.util.control.NonFatal

import org.slf4j.LoggerFactory

import io.keyedstate.checkpoint.{CheckpointFiles, StoreCleanup}
import io.keyedstate.format.KeyLayout

/**
 * The engine's maintenance: snapshot uploads and cleanup of the store partition, never at once.
 * Maintenance never throws: Spark unloads and closes a provider whose maintenance call threw,
 * even while a task is using its store (that task then fails, and the next batch reloads the
 * version from the checkpoint). A failed upload or cleanup changes nothing that loads need and
 * is simply tried again at the next tick.
 *
 * Lock order: the engine's monitor, then this one's; code holding this one reads only volatile
 * fields of the engine, never its monitor (a commit may upload and clean up).
 */
private[engine] final class StoreMaintenance(session: ServerSession, uploader: SnapshotUploader,
    files: CheckpointFiles, fence: RunFence, minVersionsToRetain: Int, describe: String, closed: () => Boolean) {
  import StoreMaintenance.log

  private val mutex = new Object // snapshot upload vs cleanup
  private val fileCleanup = new StoreCleanup(files)

  /**
   * Uploads the snapshots the server staged; `uploaded` gets the newest version now in the
   * checkpoint, under this one's lock.
   * A stopped run's provider does this once more before Spark closes it, while the next run may
   * already work on the same directory: that is safe because a snapshot only adds files under
   * fresh names, lists only files verified to be there, replaces a manifest only when it is of
   * another run's attempt ([[SnapshotUploader]]), and a load skips a snapshot that turns out
   * broken anyway. Deleting is not: only the active instance cleans up ([[cleanUp]]).
   * `through`: see [[SnapshotUploader.upload]].
   */
  def upload(layout: KeyLayout, ttl: Option[java.util.Map[String, AnyRef]],
      uniqueIdOf: Long => Either[Unit, Option[String]], through: Long)(uploaded: Long => Unit): Unit = mutex.synchronized {
    retriedLater("snapshot upload") {
      uploader.upload(session, session.settings.keyGroups, layout, ttl, uniqueIdOf, through).foreach(uploaded)
    }
  }

  /**
   * Deletes what no retained version needs, if active ([[RunFence]]), counting back from the
   * version `head` gives (read once no upload runs); skipped, after a cleanup that settled, while
   * it could take no newer base ([[StoreCleanup]]).
   */
  def cleanUp(head: () => (Long, Option[String]), newestSnapshot: () => Long, byLineage: Boolean): Unit =
    mutex.synchronized {
      if (closed() || !fence.isActive) {
        log.debug(s"keyedstate: no cleanup of $describe: closed, or not the active instance of its store")
        return
      }
      val from = head()
      if (from._1 <= 0) { // nothing loaded nor committed: the newest file listed may be an uncommitted attempt
        log.debug(s"keyedstate: no cleanup of $describe before a version is loaded")
        return
      }
      retriedLater("cleanup") {
        val deleted = fileCleanup.run(minVersionsToRetain, from._1, from._2, newestSnapshot(), byLineage = byLineage)
        if (deleted > 0) log.info(s"keyedstate: cleanup deleted $deleted files of $describe")
      }
    }

  private def retriedLater(what: String)(f: => Unit): Unit =
    try f catch {
      case NonFatal(e) => if (!closed()) log.warn(s"keyedstate: $what of $describe failed; retried at the next maintenance", e)
    }
}

private[engine] object StoreMaintenance {
  private val log = LoggerFactory.getLogger(classOf[StoreMaintenance])
}
