package io.keyedstate.engine

import java.nio.file.{Files, Path}
import java.util.UUID

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.ObjectMapper

import io.keyedstate.bridge.{LocalFiles, ServerLaunch}
import io.keyedstate.checkpoint.{CheckpointFileException, CheckpointFiles}
import io.keyedstate.format.SnapshotFile

/**
 * Brings the state server's store to a version from the checkpoint: the newest snapshot at or
 * below it (its files downloaded into a private local directory, then installed by the server),
 * then the changelogs after it, replayed in order. Any executor can load any version this way.
 */
final class VersionLoader(files: CheckpointFiles, uploader: SnapshotUploader, describe: String) {
  import VersionLoader._

  /** Loads `version` into the session's store (empty for version 0); returns the exact key count. */
  def load(session: ServerSession, version: Long, keyGroups: Int, workDir: Path): Long = {
    if (version == 0) {
      restoreEmpty(session, 0)
      return 0
    }
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
    val localRoot = Files.createDirectories(workDir.resolve("restore").resolve(UUID.randomUUID().toString))
    try {
      base match {
        case Some(s) => restoreSnapshot(session, s, keyGroups, localRoot)
        case None => restoreEmpty(session, 0)
      }
      // Replay in groups so that local disk holds a bounded number of changelog copies.
      needed.grouped(ReplayGroup).foreach { group =>
        val locals = group.map { v =>
          val local = localRoot.resolve(s"$v.ks-changelog")
          files.download(files.changelog(v), local)
          (v, local, files.changelog(v).toString)
        }
        replay(session, locals, s"replaying changelogs ${group.head}..${group.last} of $describe")
        locals.foreach { case (_, p, _) => Files.deleteIfExists(p) }
      }
    } finally LocalFiles.deleteTree(localRoot)
    Json.readTree(session.control("reading store info")((api, h) => api.storeInfo(h))).get("numKeys").asLong()
  }

  /** Makes the store hold an empty `version` (Spark loads version 0 empty, or asks for `loadEmpty`). */
  def restoreEmpty(session: ServerSession, version: Long): Unit = {
    val lineage = uploader.newLineage(Nil)
    session.control(s"loading version $version of $describe")((api, h) => api.restore(h, version, null, lineage, 0))
  }

  private def restoreSnapshot(session: ServerSession, s: Long, keyGroups: Int, localRoot: Path): Unit = {
    val source = files.manifest(s).toString
    val manifest = files.readManifest(s)
    if (manifest.keyGroups != keyGroups) {
      throw new CheckpointFileException(
        s"keyedstate: $source was written with keyGroups=${manifest.keyGroups} but this query sets " +
          s"${ServerLaunch.ConfPrefix}keyGroups=$keyGroups; the key-group count is fixed for a checkpoint")
    }
    val snapDir = Files.createDirectories(localRoot.resolve("snapshot"))
    manifest.files.foreach(f => download(f, snapDir, source))
    val lineage = uploader.newLineage(manifest.files)
    manifest.replay match {
      case None =>
        session.control(s"restoring snapshot $source")((api, h) => api.restore(h, s, snapDir.toString, lineage, manifest.numKeys))
      case Some(r) => // the files as version s - 1, then the version itself as a changelog
        val dir = if (manifest.files.isEmpty) null else snapDir.toString
        session.control(s"restoring snapshot $source")((api, h) => api.restore(h, s - 1, dir, lineage, 0))
        val local = download(r, localRoot, source)
        replay(session, Seq((s, local, files.resolve(r.path).toString)), s"replaying ${files.resolve(r.path)}")
        Files.deleteIfExists(local)
    }
  }

  /** Downloads a snapshot file (name and path were checked when the manifest was read) and
   *  checks its size against the manifest. */
  private def download(f: SnapshotFile, dir: Path, manifest: String): Path = {
    val local = dir.resolve(f.name)
    files.download(files.resolve(f.path), local)
    val size = Files.size(local)
    if (size != f.size) {
      throw new CheckpointFileException(s"keyedstate: ${files.resolve(f.path)} has $size bytes but snapshot " +
        s"manifest $manifest says ${f.size}: truncated or corrupt")
    }
    local
  }

  private def replay(session: ServerSession, logs: Seq[(Long, Path, String)], what: String): Unit = {
    val json = Json.writeValueAsString(logs.map { case (v, local, origin) =>
      java.util.List.of(Long.box(v), local.toString, origin)
    }.asJava)
    session.control(what)((api, h) => api.replay(h, json))
  }
}

object VersionLoader {
  private val Json = new ObjectMapper()
  private val ReplayGroup = 32
}
