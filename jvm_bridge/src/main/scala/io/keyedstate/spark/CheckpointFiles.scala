package io.keyedstate.spark

import java.nio.ByteBuffer
import java.nio.charset.StandardCharsets
import java.util.UUID

import scala.collection.immutable.SortedSet
import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.hadoop.io.IOUtils

/** A checkpoint file is unreadable, foreign or missing; the message names it. */
class CheckpointFileException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)

final case class SnapshotFile(name: String, path: String, size: Long)

/**
 * Which files make up the RocksDB snapshot of one version. `replay`: a changelog (in ks-files)
 * that holds the whole version on top of the files (written by the offline rescale, which
 * routes an old partition's changelogs into its new partitions without building RocksDB);
 * loading applies it as version `version` onto `files` taken as version `version - 1`.
 */
final case class SnapshotManifest(version: Long, keyGroups: Int, numKeys: Long, files: Seq[SnapshotFile],
    ttl: Option[java.util.Map[String, AnyRef]] = None, replay: Option[SnapshotFile] = None)

final case class Listing(changelogs: SortedSet[Long], snapshots: SortedSet[Long], foreign: Seq[String]) {
  def latest: Option[Long] = (changelogs ++ snapshots).lastOption
}

/**
 * The layout of one store partition's checkpoint directory, through Hadoop's FileSystem API
 * so that every checkpoint location Spark accepts works:
 *
 *   <v>.ks-changelog     the writes of version v (the commit record; see changelog.py)
 *   <v>.ks-snapshot      JSON manifest of the RocksDB snapshot of version v
 *   ks-files/<uuid>-<n>  snapshot files (and a rescale's replay changelogs); immutable, shared
 *                        by every manifest that lists them
 *
 * Files appear atomically (temp file + rename), so a reader never sees half a file under its
 * final name.
 */
final class CheckpointFiles(val dir: Path, hadoopConf: Configuration) {
  import CheckpointFiles._

  private val fs: FileSystem = dir.getFileSystem(hadoopConf)
  val filesDir = new Path(dir, "ks-files")

  def changelog(version: Long): Path = new Path(dir, s"$version$ChangelogSuffix")
  def manifest(version: Long): Path = new Path(dir, s"$version$ManifestSuffix")

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
    def versions(suffix: String) =
      SortedSet(names.filter(_.endsWith(suffix)).flatMap(n => n.stripSuffix(suffix).toLongOption).toIndexedSeq: _*)
    Listing(versions(ChangelogSuffix), versions(ManifestSuffix), names.filter(ForeignFile.matches).sorted.toSeq)
  }

  def download(path: Path, local: java.nio.file.Path): Unit =
    try fs.copyToLocalFile(false, path, new Path(local.toUri), true)
    catch { case NonFatal(e) => throw unreadable(path, e) }

  private def unreadable(path: Path, e: Throwable) = new CheckpointFileException(
    s"keyedstate: cannot read $path: it is missing, truncated or corrupt (${e.getMessage})", e)

  def upload(local: java.nio.file.Path, path: Path): Unit =
    fs.copyFromLocalFile(false, true, new Path(local.toUri), path)

  def readManifest(version: Long): SnapshotManifest = {
    val path = manifest(version)
    val text = try {
      val in = fs.open(path)
      try new String(IOUtils.readFullyToByteArray(in), StandardCharsets.UTF_8) finally in.close()
    } catch { case NonFatal(e) => throw unreadable(path, e) }
    try {
      val node = Json.readTree(text)
      if (node == null || node.path("format").asText() != ManifestFormat) {
        throw new IllegalArgumentException("not a keyedstate snapshot manifest")
      }
      val formatVersion = node.path("formatVersion").asInt(-1)
      if (formatVersion != ManifestFormatVersion) {
        throw new IllegalArgumentException(s"manifest format version $formatVersion, this keyedstate reads $ManifestFormatVersion")
      }
      def file(f: com.fasterxml.jackson.databind.JsonNode) =
        SnapshotFile(f.get("name").asText(), f.get("path").asText(), f.get("size").asLong())
      val files = node.get("files").elements().asScala.map(file).toSeq
      val replay = Option(node.get("replay")).filterNot(_.isNull).map(file)
      val m = SnapshotManifest(node.get("version").asLong(), node.get("keyGroups").asInt(),
        node.get("numKeys").asLong(), files, replay = replay)
      if (m.version != version) throw new IllegalArgumentException(s"it describes version ${m.version}")
      m
    } catch {
      case e: CheckpointFileException => throw e
      case NonFatal(e) => throw new CheckpointFileException(
        s"keyedstate: snapshot manifest $path is truncated or corrupt (${e.getMessage})", e)
    }
  }

  def writeManifest(m: SnapshotManifest): Unit = {
    val files = m.files.map(f => Map("name" -> f.name, "path" -> f.path, "size" -> Long.box(f.size)).asJava).asJava
    val tree = Map[String, AnyRef](
      "format" -> ManifestFormat, "formatVersion" -> Int.box(ManifestFormatVersion),
      "version" -> Long.box(m.version), "keyGroups" -> Int.box(m.keyGroups),
      "numKeys" -> Long.box(m.numKeys), "files" -> files).++(m.ttl.map("ttl" -> _)).asJava
    writeAtomically(manifest(m.version), ByteBuffer.wrap(Json.writerWithDefaultPrettyPrinter().writeValueAsBytes(tree)))
  }

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

  def resolve(relative: String): Path = new Path(dir, relative)
}

object CheckpointFiles {
  val ChangelogSuffix = ".ks-changelog"
  val ManifestSuffix = ".ks-snapshot"
  val ManifestFormat = "keyedstate-snapshot"
  val ManifestFormatVersion = 1
  private val Json = new ObjectMapper()
  /** Files of Spark's HDFS-backed and RocksDB providers. */
  private val ForeignFile = """\d+\.(delta|snapshot|zip|changelog)""".r
}
