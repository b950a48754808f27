package io.keyedstate.checkpoint

import java.nio.ByteBuffer
import java.util.UUID

import scala.collection.immutable.SortedSet
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.hadoop.io.IOUtils

import io.keyedstate.format.{CheckpointLayout, CorruptManifestException, ManifestFormat, SnapshotManifest,
  UnsafePathException}

/** A checkpoint file is unreadable, foreign or missing; the message names it. */
class CheckpointFileException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)

final case class Listing(changelogs: SortedSet[Long], snapshots: SortedSet[Long], foreign: Seq[String]) {
  def latest: Option[Long] = (changelogs ++ snapshots).lastOption
}

/**
 * One store partition's checkpoint directory ([[CheckpointLayout]]), through Hadoop's FileSystem
 * API so that every checkpoint location Spark accepts works (Spark's `RocksDBFileManager` is the
 * model): listing versions, reading and writing changelogs and manifests, uploading and
 * downloading snapshot files, cleanup. Files appear atomically (temp file + rename), so a
 * reader never sees half a file under its final name.
 */
final class CheckpointFiles(val dir: Path, hadoopConf: Configuration) {
  private val fs: FileSystem = dir.getFileSystem(hadoopConf)
  val filesDir = new Path(dir, CheckpointLayout.FilesDir)

  def changelog(version: Long): Path = new Path(dir, CheckpointLayout.changelogName(version))
  def manifest(version: Long): Path = new Path(dir, CheckpointLayout.manifestName(version))

  @volatile private var dirsExist = false
  /** Creates the partition directory (Spark's state reader discovers partitions by listing). */
  def ensureDirs(): Unit = if (!dirsExist) { fs.mkdirs(filesDir); dirsExist = true }

  def writeAtomically(path: Path, data: ByteBuffer): Unit = {
    val temp = new Path(path.getParent, s".${path.getName}.${UUID.randomUUID()}.tmp")
    try {
      val out = fs.create(temp, true)
      try {
        out.write(data.array(), data.arrayOffset() + data.position(), data.remaining())
        out.hsync()
      } finally out.close()
      if (fs.exists(path)) fs.delete(path, false) // a retried task rewrites its version
      if (!fs.rename(temp, path)) throw new java.io.IOException(s"rename $temp -> $path failed")
    } catch {
      case NonFatal(e) =>
        try fs.delete(temp, false) catch { case NonFatal(_) => }
        throw new CheckpointFileException(s"keyedstate: cannot write $path: ${e.getMessage}", e)
    }
  }

  def listing(): Listing = {
    val names = if (fs.exists(dir)) fs.listStatus(dir).filter(_.isFile).map(_.getPath.getName) else Array.empty[String]
    def versions(suffix: String) = SortedSet(names.flatMap(CheckpointLayout.versionOf(_, suffix)).toIndexedSeq: _*)
    Listing(versions(CheckpointLayout.ChangelogSuffix), versions(CheckpointLayout.ManifestSuffix),
      names.filter(CheckpointLayout.ForeignFile.matches).sorted.toSeq)
  }

  def download(path: Path, local: java.nio.file.Path): Unit =
    try fs.copyToLocalFile(false, path, new Path(local.toUri), true)
    catch { case NonFatal(e) => throw unreadable(path, e) }

  private def unreadable(path: Path, e: Throwable) = new CheckpointFileException(
    s"keyedstate: cannot read $path: it is missing, truncated or corrupt (${e.getMessage})", e)

  def upload(local: java.nio.file.Path, path: Path): Unit =
    fs.copyFromLocalFile(false, true, new Path(local.toUri), path)

  /** Reads and checks the manifest of `version` (names and paths by [[CheckpointLayout]]'s rule). */
  def readManifest(version: Long): SnapshotManifest = {
    val path = manifest(version)
    val data = try {
      val in = fs.open(path)
      try IOUtils.readFullyToByteArray(in) finally in.close()
    } catch { case NonFatal(e) => throw unreadable(path, e) }
    try ManifestFormat.decode(data, path.toString, version)
    catch {
      case e @ (_: CorruptManifestException | _: UnsafePathException) => throw new CheckpointFileException(s"keyedstate: ${e.getMessage}", e)
    }
  }

  def writeManifest(m: SnapshotManifest): Unit = writeAtomically(manifest(m.version), ByteBuffer.wrap(ManifestFormat.encode(m)))

  /**
   * Deletes what no retained version needs: keeps the newest snapshot at or below the oldest
   * retained version, every changelog after it, and the snapshot files those manifests list.
   * Returns the number of files deleted.
   */
  def cleanup(minVersionsToRetain: Int): Int = {
    val l = listing()
    val latest = l.latest.getOrElse(return 0)
    val oldestRetained = latest - minVersionsToRetain + 1
    val base = l.snapshots.filter(_ <= oldestRetained).lastOption.getOrElse(return 0)
    var deleted = 0
    def delete(p: Path): Unit = if (fs.delete(p, false)) deleted += 1
    l.changelogs.filter(_ <= base).foreach(v => delete(changelog(v)))
    l.snapshots.filter(_ < base).foreach(v => delete(manifest(v)))
    val kept = l.snapshots.filter(_ >= base).toSeq
    val referenced = kept.flatMap { v => val m = readManifest(v); (m.files ++ m.replay).map(_.path) }.toSet
    // Files newer than the oldest kept manifest may belong to an upload in progress.
    val horizon = fs.getFileStatus(manifest(base)).getModificationTime
    if (fs.exists(filesDir)) {
      fs.listStatus(filesDir).filter(_.isFile).foreach { st =>
        val rel = s"${filesDir.getName}/${st.getPath.getName}"
        if (!rel.endsWith(".crc") && !referenced.contains(rel) && st.getModificationTime < horizon) delete(st.getPath)
      }
    }
    deleted
  }

  def newSnapshotFilePath(localName: String): (String, Path) = {
    val rel = s"${filesDir.getName}/${UUID.randomUUID()}-$localName"
    (rel, new Path(dir, rel))
  }

  /** A path a manifest lists (checked by [[CheckpointLayout.checkedRelativePath]] when read). */
  def resolve(relative: String): Path = new Path(dir, relative)
}
