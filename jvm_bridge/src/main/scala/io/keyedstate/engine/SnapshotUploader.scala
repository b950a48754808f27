package io.keyedstate.engine

import java.nio.file.Paths
import java.util.UUID
import java.util.concurrent.atomic.AtomicLong

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.slf4j.LoggerFactory

import io.keyedstate.checkpoint.{CheckpointFileException, CheckpointFiles}
import io.keyedstate.format.{CheckpointLayout, KeyLayout, SnapshotFile, SnapshotManifest}

/**
 * Uploads the snapshots the state server staged (RocksDB checkpoints of committed versions) to
 * the checkpoint, incrementally: an SST file already uploaded for the same RocksDB lineage is
 * listed again, not copied. A lineage starts whenever the server's database is replaced (a load)
 * and lists the files the load installed; SST names never repeat within one lineage.
 *
 * Under checkpoint format 1 a version's snapshot is of the changelog this run committed: a later
 * run that executes the batch again replaces that changelog and deletes its manifest
 * ([[CheckpointFiles.replace]]), and a snapshot this run still uploads then is not the version.
 * The manifest names this run, so that a load can tell such a snapshot from the version's even
 * when this run stopped before it could take its manifest back ([[VersionLoader]]); cleanup
 * takes no such snapshot as its base, and a later upload of the version replaces its manifest.
 */
final class SnapshotUploader(files: CheckpointFiles, describe: String, runId: Option[String]) {
  import SnapshotUploader._

  private val lock = new Object // `lineage`, `uploaded`
  private var lineage = ""
  // Snapshot files of the current lineage, uploaded or loaded: (name, size) -> path.
  private var uploaded: Map[(String, Long), String] = Map.empty

  val bytesUploaded = new AtomicLong
  val filesUploaded = new AtomicLong
  val filesReused = new AtomicLong

  /** A new lineage that starts with the snapshot files a load installed; its id for the server. */
  def newLineage(installed: Seq[SnapshotFile]): String = {
    val id = UUID.randomUUID().toString
    lock.synchronized {
      lineage = id
      uploaded = installed.map(f => (f.name, f.size) -> f.path).toMap
    }
    id
  }

  /** Uploads every staged snapshot of the store, then asks the server to drop it; returns the
   *  newest version now in the checkpoint. `through` >= 0: once that version's is staged (the
   *  server does not wait for the applies queued after it); -1: whatever is staged now. */
  def upload(session: ServerSession, keyGroups: Int, keyLayout: KeyLayout,
      ttl: Option[java.util.Map[String, AnyRef]], uniqueIdOf: Long => Either[Unit, Option[String]],
      through: Long): Option[Long] = {
    val staged = Json.readTree(session.maintenance("listing staged snapshots")((api, h) => api.stagedSnapshots(h, through)))
    var newest: Option[Long] = None
    if (staged.size() > 0) files.refuseLinks()
    staged.elements().asScala.foreach { snap =>
      val version = snap.get("version").asLong()
      val snapLineage = snap.get("lineage").asText()
      val (sameLineage, known) = lock.synchronized((snapLineage == lineage, uploaded))
      try {
        // Under checkpoint format 2 a snapshot is of one (version, id); unknown: not uploaded.
        val id = uniqueIdOf(version).getOrElse(throw new IllegalStateException(s"the unique id of version $version is unknown"))
        if (!committedHere(version, id)) throw new Replaced(version)
        val dir = Paths.get(snap.get("dir").asText())
        var reused = Vector.empty[SnapshotFile]
        val entries = snap.get("files").elements().asScala.map { f =>
          val name = f.get("name").asText()
          val size = f.get("size").asLong()
          // Reuse an SST uploaded before only while it is still there: cleanup, or an overlapping
          // run's, may have deleted it since.
          val reusable = (if (sameLineage && CheckpointLayout.isTableFile(name)) known.get((name, size)) else None)
            .filter(path => files.holds(SnapshotFile(name, path, size)))
          val path = reusable.getOrElse {
            val (rel, target) = files.newSnapshotFilePath(name)
            files.upload(dir.resolve(name), target)
            bytesUploaded.addAndGet(size)
            filesUploaded.incrementAndGet()
            rel
          }
          val entry = SnapshotFile(name, path, size)
          if (reusable.isDefined) { filesReused.incrementAndGet(); reused :+= entry }
          entry
        }.toVector
        val manifest = SnapshotManifest(version, keyGroups, snap.get("numKeys").asLong(), entries,
          keyLayout = Some(keyLayout), ttl = ttl, runId = runId)
        if (!files.writeManifest(manifest, id) && !replacedStale(version, id, manifest)) {
          log.info(s"keyedstate: version $version of $describe already has a snapshot; keeping it")
        } else if (!reused.forall(files.holds)) {
          // A reused file vanished between its check and the manifest (a concurrent cleanup): the
          // manifest would not load. Remove it; loads use an older snapshot and changelogs. A file
          // this upload wrote has the size its writer counted; loads and cleanup check every
          // listed file anyway, so a snapshot broken later costs a replay, never the version.
          files.delete(files.manifest(version, id))
          throw new IllegalStateException(s"a listed file vanished while the manifest was written")
        } else if (!committedHere(version, id)) {
          files.delete(files.manifest(version, id)) // replaced while the manifest was written
          throw new Replaced(version)
        }
        lock.synchronized {
          if (snapLineage == lineage) uploaded ++= entries.filter(f => CheckpointLayout.isTableFile(f.name)).map(f => (f.name, f.size) -> f.path)
        }
        newest = Some(version)
        log.info(s"keyedstate: uploaded snapshot of version $version of $describe " +
          s"(${entries.size} files, ${entries.count(e => !known.get((e.name, e.size)).contains(e.path))} new)")
      } catch {
        case e: Replaced => log.info(s"keyedstate: ${e.getMessage}; its snapshot of $describe is dropped")
        case NonFatal(e) =>
          log.warn(s"keyedstate: snapshot upload of version $version of $describe failed; will retry later", e)
          return newest
      } finally {
        // Either uploaded or failed; a failed staged copy is dropped too (the changelogs stay).
        try session.maintenance("dropping a staged snapshot")((api, h) => api.dropStaged(h, version)) catch { case NonFatal(_) => }
      }
    }
    newest
  }

  /**
   * Under checkpoint format 1, replaces the manifest of `version` found in the checkpoint with this
   * run's `manifest` when it is of another run's attempt: kept, a load would skip it and this run's
   * snapshot would be lost. Only on evidence read back: the found manifest names another run and
   * the version's changelog names this one. False when the manifest found stays (this run's, an
   * offline writer's, or one that cannot be checked: a failed read proves nothing).
   */
  private def replacedStale(version: Long, id: Option[String], manifest: SnapshotManifest): Boolean =
    id.isEmpty && runId.isDefined && {
      val found = try files.readManifest(version, None).runId catch { case _: CheckpointFileException => None }
      val committed = try files.readChangelogMeta(version, None).runId catch { case _: CheckpointFileException => None }
      found.exists(run => !runId.contains(run)) && committed == runId && {
        log.info(s"keyedstate: the snapshot manifest of version $version of $describe in the checkpoint was " +
          s"uploaded by run ${found.get}, but ${files.changelog(version, None)} was committed by run ${runId.get}: " +
          "a snapshot of another attempt of the version; replacing it with this run's")
        files.delete(files.manifest(version, None))
        files.writeManifest(manifest, None)
      }
    }

  /**
   * Whether the changelog of `version` in the checkpoint is this run's ([[SnapshotUploader]]). An
   * absent one counts as this run's (cleanup, or a later run's replace between its deletes and
   * its write, which deletes the manifest again after the write): only another run's file refuses.
   */
  private def committedHere(version: Long, id: Option[String]): Boolean =
    id.isDefined || (try files.readChangelogMeta(version, None).runId == runId catch {
      case e: CheckpointFileException => CheckpointFiles.missing(e)
    })
}

object SnapshotUploader {
  private val log = LoggerFactory.getLogger(classOf[SnapshotUploader])
  private val Json = new ObjectMapper()

  private final class Replaced(version: Long)
    extends RuntimeException(s"version $version was executed again by a later run, which replaced its changelog")
}
