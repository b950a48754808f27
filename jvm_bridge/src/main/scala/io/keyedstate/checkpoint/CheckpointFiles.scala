package io.keyedstate.checkpoint

import java.io.{FileNotFoundException, InputStream, IOException}
import java.nio.ByteBuffer
import java.nio.channels.Channels
import java.nio.file.{Files, LinkOption, NoSuchFileException, StandardOpenOption}
import java.nio.file.attribute.{BasicFileAttributes, PosixFilePermissions}
import java.util.UUID

import scala.collection.immutable.SortedSet
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileStatus, FileSystem, Path}
import org.apache.hadoop.io.IOUtils
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager

import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, CheckpointLayout, CorruptChangelogException,
  CorruptManifestException, ManifestFormat, SnapshotFile, SnapshotManifest, UnsafePathException}

/** A checkpoint file is unreadable, foreign or missing; the message names it. */
class CheckpointFileException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)

/** The local disk (not the checkpoint) failed, e.g. it is full; the message says where. */
class LocalDiskException(message: String, cause: Throwable = null) extends IOException(message, cause)

/** A store partition's files: (version, unique id) of every changelog and snapshot manifest. */
final case class Listing(changelogFiles: Set[(Long, Option[String])], snapshotFiles: Set[(Long, Option[String])],
    foreign: Seq[String], modified: Map[String, Long]) {
  def changelogs: SortedSet[Long] = SortedSet(changelogFiles.map(_._1).toSeq: _*)
  def snapshots: SortedSet[Long] = SortedSet(snapshotFiles.map(_._1).toSeq: _*)
  def latest: Option[Long] = (changelogs ++ snapshots).lastOption
}

/**
 * One store partition's checkpoint directory ([[CheckpointLayout]]), through Spark's
 * `CheckpointFileManager` (the one `spark.sql.streaming.checkpointFileManagerClass` names, or
 * Spark's default for the scheme), so that every checkpoint location Spark accepts works, object
 * stores included (Spark's `RocksDBFileManager` is the model): listing versions, reading and
 * writing changelogs and manifests, uploading and downloading snapshot files, cleanup.
 *
 * A file appears whole under its final name (`createAtomic`), and a committed file is never
 * replaced or deleted before nothing needs it: a second writer of the same name finds it there
 * and keeps it ([[createOnce]]), so there is no moment in which a committed version is absent.
 * Only an attempt Spark never committed is replaced ([[replace]]).
 */
final class CheckpointFiles(val dir: Path, hadoopConf: Configuration) {
  private val fm = CheckpointFileManager.create(dir, hadoopConf)
  private lazy val fs = dir.getFileSystem(hadoopConf) // file sizes only: the manager has no stat
  val filesDir = new Path(dir, CheckpointLayout.FilesDir)

  def changelog(version: Long, id: Option[String] = None): Path = new Path(dir, CheckpointLayout.changelogName(version, id))
  def manifest(version: Long, id: Option[String] = None): Path = new Path(dir, CheckpointLayout.manifestName(version, id))

  @volatile private var dirsExist = false
  /** Creates the partition directory (Spark's state reader discovers partitions by listing). */
  def ensureDirs(): Unit = if (!dirsExist) { fm.mkdirs(filesDir); dirsExist = true }

  /**
   * Publishes `path` in place of a file of that name that is not the version: an attempt Spark
   * never committed, which a later run of the query executes again. The files built from the old
   * attempt (`derived`: the version's snapshot manifest) go first, then the file itself, then
   * `path` is written as by [[createOnce]] (false: another attempt of this run was first). A
   * crash in between leaves the old attempt without its snapshot, or no file, for a batch Spark
   * runs again either way; the new file never appears beside the old attempt's snapshot. (A
   * rename onto an existing object fails or keeps it on object stores: no overwrite in place.)
   */
  def replace(path: Path, data: ByteBuffer, derived: Seq[Path]): Boolean = {
    val deleteAll = (paths: Seq[Path]) => paths.foreach { p =>
      try fm.delete(p) catch {
        case NonFatal(e) =>
          throw new CheckpointFileException(s"keyedstate: cannot delete $p from the checkpoint: ${e.getMessage}", e)
      }
    }
    deleteAll(derived :+ path)
    val created = createOnce(path, data)
    // The earlier run's upload may have published a derived file while `path` was absent (it
    // takes an absent changelog as its own): gone again once this attempt's file is there.
    if (created) deleteAll(derived)
    created
  }

  /**
   * Writes `path` atomically unless a file of that name exists; returns false (and leaves the
   * existing file untouched) when it does: another attempt of the same version was first. So
   * does a close that fails once the file is there: on an object store a rename copies, then
   * deletes, and a task killed in between leaves this attempt's own complete file.
   */
  def createOnce(path: Path, data: ByteBuffer): Boolean = {
    // No probe first: the rename that publishes the file refuses an existing one (Spark's
    // createAtomic without overwrite), and the close below tells that case apart.
    val out = try fm.createAtomic(path, false) catch { case NonFatal(e) => throw unwritable(path, e) }
    try {
      out.write(data.array(), data.arrayOffset() + data.position(), data.remaining())
      out.hsync()
    } catch {
      case NonFatal(e) =>
        try out.cancel() catch { case NonFatal(_) => }
        throw unwritable(path, e)
    }
    try { out.close(); true } catch {
      case NonFatal(e) if exists(path) =>
        LogHolder.log.info(s"keyedstate: $path exists after its write failed (another attempt's, or this one's " +
          s"published before the failure); keeping it ($e)")
        false
      case NonFatal(e) => throw unwritable(path, e)
    }
  }

  private def unwritable(path: Path, e: Throwable) =
    new CheckpointFileException(s"keyedstate: cannot write $path to the checkpoint: ${e.getMessage}", e)

  def exists(path: Path): Boolean = fm.exists(path)

  def listing(): Listing = {
    refuseLinks(filesDir)
    val statuses = list(dir).filter(_.isFile)
    val names = statuses.map(_.getPath.getName)
    def versions(suffix: String) = names.flatMap(CheckpointLayout.versionOf(_, suffix)).toSet
    Listing(versions(CheckpointLayout.ChangelogSuffix), versions(CheckpointLayout.ManifestSuffix),
      names.filter(CheckpointLayout.ForeignFile.matches).sorted.toSeq,
      statuses.map(s => s.getPath.getName -> s.getModificationTime).toMap)
  }

  private def list(path: Path): Array[FileStatus] = {
    refuseLinks(path)
    // A missing directory lists as FileNotFoundException: no existence probe first.
    try fm.list(path) catch { case _: FileNotFoundException => Array.empty }
  }

  /** Fails when a directory a snapshot's files go to is a symbolic link ([[refuseLinks]]). */
  def refuseLinks(): Unit = refuseLinks(filesDir)

  /**
   * Fails on a symbolic link among the directories of the store partition (`path` and those
   * above it, up to the query's `state` directory) on a local disk (through java.nio: Hadoop's
   * local link status starts a process per call): what is listed, read and deleted there would
   * be outside the checkpoint. Object stores have no links, and Hadoop 3 disables HDFS's.
   */
  private def refuseLinks(path: Path): Unit = if (localDisk) {
    Iterator.iterate(path)(_.getParent).takeWhile(p => p != null && p.getName != "state" && p.depth() > 0).take(4)
      .foreach { p =>
        val local = java.nio.file.Paths.get(fs.makeQualified(p).toUri)
        if (Files.isSymbolicLink(local)) {
          throw new CheckpointFileException(s"keyedstate: $p in the checkpoint is a symbolic link (to " +
            s"${Files.readSymbolicLink(local)}); keyedstate lists, reads and deletes nothing through one: replace it " +
            "with the directory itself")
        }
      }
  }
  private lazy val localDisk = fs.getScheme == "file"

  private def open(path: Path, withLength: Boolean = false): CheckpointFiles.Opened =
    CheckpointFiles.open(fs, path, withLength)(fm.open(_))

  /** Copies a checkpoint file to local disk; a failure says which side failed. */
  def download(path: Path, local: java.nio.file.Path): Unit = {
    val in = open(path).in
    try copy(in, path, local) finally in.close()
  }

  private def copy(in: InputStream, path: Path, local: java.nio.file.Path): Unit = {
    val out = try Channels.newOutputStream(createPrivate(local))
      catch { case e: IOException => throw LocalDisk.failed(local, e) }
    try {
      val buf = new Array[Byte](1 << 16)
      var n = readOrFail(in, buf, path)
      while (n >= 0) {
        try out.write(buf, 0, n) catch { case e: IOException => throw LocalDisk.failed(local, e) }
        n = readOrFail(in, buf, path)
      }
    } finally {
      try out.close() catch { case e: IOException => throw LocalDisk.failed(local, e) }
    }
  }

  private def readOrFail(in: InputStream, buf: Array[Byte], path: Path): Int =
    try in.read(buf) catch { case NonFatal(e) => throw unreadable(path, e) }

  private def unreadable(path: Path, e: Throwable) = CheckpointFiles.unreadable(path, e)

  /** A changelog of the checkpoint, as format 1 on local disk (decompressed here, in the JVM, so
   *  that the state server replays it at full speed); returns its metadata. */
  def downloadChangelog(version: Long, id: Option[String], local: java.nio.file.Path): ChangelogMeta = {
    val path = changelog(version, id)
    val (inner, meta) = try ChangelogFormat.innerAndMeta(readBytes(path, CheckpointFiles.MaxChangelogBytes, "changelog"),
        path.toString) catch {
      case e: CorruptChangelogException => throw new CheckpointFileException(s"keyedstate: ${e.getMessage}", e)
    }
    try {
      val out = createPrivate(local)
      try { val data = ByteBuffer.wrap(inner); while (data.hasRemaining) out.write(data) } finally out.close()
    } catch { case e: IOException => throw LocalDisk.failed(local, e) }
    meta
  }

  /** A new local file readable by the user alone (0600 whatever the umask), as all local state. */
  private def createPrivate(local: java.nio.file.Path) =
    Files.newByteChannel(local, java.util.Set.of(StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE),
      PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")))

  /** Copies a local file into the checkpoint under a name no one else uses. */
  def upload(local: java.nio.file.Path, path: Path): Unit = {
    val out = try fm.createAtomic(path, false) catch { case NonFatal(e) => throw unwritable(path, e) }
    try {
      Files.copy(local, out)
      out.close()
    } catch {
      case NonFatal(e) =>
        try out.cancel() catch { case NonFatal(_) => }
        throw unwritable(path, e)
    }
  }

  /** Whether a snapshot file is in the checkpoint with the size a manifest says. */
  def holds(f: SnapshotFile): Boolean =
    try { val s = fs.getFileStatus(resolve(f.path)); s.isFile && s.getLen == f.size } catch { case NonFatal(_) => false }

  /** A whole checkpoint file of `kind`, refused unread when it has more than `maxBytes` bytes
   *  ([[CheckpointFiles.readAll]]). */
  def readBytes(path: Path, maxBytes: Long, kind: String): Array[Byte] = {
    val opened = open(path, withLength = true)
    try CheckpointFiles.readAll(opened, path, maxBytes, kind) finally opened.in.close()
  }

  /** The metadata of a changelog, from its header alone (format 1: none). */
  def readChangelogMeta(version: Long, id: Option[String]): ChangelogMeta = {
    val path = changelog(version, id)
    val in = open(path).in
    try {
      var head = new Array[Byte](0)
      var result: Either[Int, ChangelogMeta] = Left(15)
      while (result.isLeft) {
        val want = result.left.getOrElse(0)
        val more = new Array[Byte](want - head.length)
        try IOUtils.readFully(in, more, 0, more.length) catch { case NonFatal(e) => throw unreadable(path, e) }
        head = head ++ more
        result = ChangelogFormat.readMeta(head, path.toString)
      }
      result.toOption.get
    } catch {
      case e: CorruptChangelogException => throw new CheckpointFileException(s"keyedstate: ${e.getMessage}", e)
    } finally in.close()
  }

  /** Reads and checks the manifest of `version` (names and paths by [[CheckpointLayout]]'s rule). */
  def readManifest(version: Long, id: Option[String] = None): SnapshotManifest = {
    val path = manifest(version, id)
    val data = readBytes(path, CheckpointFiles.MaxManifestBytes, "snapshot manifest")
    try ManifestFormat.decode(data, path.toString, version)
    catch {
      case e @ (_: CorruptManifestException | _: UnsafePathException) =>
        throw new CheckpointFileException(s"keyedstate: ${e.getMessage}", e)
    }
  }

  /**
   * Under checkpoint format 1, why the snapshot of `version` that run `snapshotRun` uploaded is
   * not the version (FORMATS.md, "Which file is the version"): the version's changelog names
   * another run, whose attempt replaced the one the snapshot was taken of, or cannot be read to
   * tell. None when they agree, when the manifest names no run (offline writers, older manifests)
   * or the changelog is gone. The one check of the load, the cleanup and the upload.
   */
  def otherRun(version: Long, snapshotRun: Option[String]): Option[String] = snapshotRun.flatMap { run =>
    val path = changelog(version, None)
    val committed = try Some(readChangelogMeta(version, None).runId) catch {
      case e: CheckpointFileException if CheckpointFiles.missing(e) => None
      case e: CheckpointFileException => return Some(s"cannot be checked against $path: ${e.getMessage}")
    }
    committed.flatMap { committed =>
      if (committed.contains(run)) None
      else Some(s"was uploaded by run $run, but $path was committed by ${committed.fold("no query run")(r => s"run $r")}: " +
        "a snapshot of another attempt of the version")
    }
  }

  /** Publishes a manifest; false when the version already has one (kept: the first one wins). */
  def writeManifest(m: SnapshotManifest, id: Option[String]): Boolean =
    createOnce(manifest(m.version, id), ByteBuffer.wrap(ManifestFormat.encode(m)))

  def delete(path: Path): Unit = fm.delete(path)

  def newSnapshotFilePath(localName: String): (String, Path) = {
    val rel = s"${filesDir.getName}/${UUID.randomUUID()}-$localName"
    (rel, new Path(dir, rel))
  }

  /** A path a manifest lists (checked by [[CheckpointLayout.checkedRelativePath]] when read). */
  def resolve(relative: String): Path = new Path(dir, relative)

  /** The snapshot files directory's entries: relative path -> (size, modification time). */
  def snapshotFiles(): Map[String, (Long, Long)] =
    list(filesDir).filter(_.isFile).map { s =>
      s"${filesDir.getName}/${s.getPath.getName}" -> (s.getLen, s.getModificationTime)
    }.toMap
}

object CheckpointFiles {
  /** The most bytes a file of each kind may have (FORMATS.md, "File sizes"; Python's twin is
   *  `formats/layout.py`): a longer one is refused, naming it, before its bytes are allocated. */
  val MaxManifestBytes: Long = 16L << 20
  val MaxSparkMetadataBytes: Long = 16L << 20
  val MaxChangelogBytes: Long = ChangelogFormat.MaxBytes

  /** An open checkpoint file, and its length when it was asked for (else -1). */
  final class Opened(val in: InputStream, val length: Long)

  /** Whether a failed read found no file: the open tells, so no existence probe goes first. */
  def missing(e: CheckpointFileException): Boolean = e.getCause.isInstanceOf[FileNotFoundException]

  private[checkpoint] def unreadable(path: Path, e: Throwable) = new CheckpointFileException(
    s"keyedstate: cannot read $path from the checkpoint (${e.getMessage})", e)

  /**
   * Opens a checkpoint file (keyedstate's, or Spark's metadata), refusing a symbolic link (its
   * bytes would come from outside the checkpoint, say another query's changelog) and anything
   * but a regular file. On a local disk through java.nio, without following a link (O_NOFOLLOW):
   * a link swapped in after the check is refused by the open itself. (Hadoop's checksum files
   * beside local files are not verified on this path; every keyedstate format checks its own
   * bytes.) On HDFS its link status is checked before `hadoopOpen` opens it: a link swapped in
   * between is not caught there (Hadoop 3 disables HDFS links unless an administrator enables
   * them). Object stores have no links. Every read of a checkpoint file in the JVM comes here.
   */
  def open(fs: FileSystem, path: Path, withLength: Boolean)(hadoopOpen: Path => InputStream): Opened = {
    def link(target: => String) = new CheckpointFileException(s"keyedstate: $path in the checkpoint is a symbolic " +
      s"link (to ${try target catch { case NonFatal(_) => "?" }}); keyedstate reads no file through one: replace it " +
      "with the file itself")
    try {
      if (fs.getScheme == "file") {
        val local = java.nio.file.Paths.get(fs.makeQualified(path).toUri)
        val attributes = try Files.readAttributes(local, classOf[BasicFileAttributes], LinkOption.NOFOLLOW_LINKS)
          catch { case _: NoSuchFileException => throw new FileNotFoundException(s"$path does not exist") }
        if (attributes.isSymbolicLink) throw link(Files.readSymbolicLink(local).toString)
        if (!attributes.isRegularFile) {
          throw new CheckpointFileException(s"keyedstate: $path in the checkpoint is not a regular file; keyedstate " +
            "reads only regular files there")
        }
        val channel = try Files.newByteChannel(local, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS) catch {
          case _: NoSuchFileException => throw new FileNotFoundException(s"$path does not exist")
          // ELOOP ("... (NOFOLLOW_LINKS specified)"): a link was swapped in after the check, and
          // may be gone again by now
          case e: IOException if Files.isSymbolicLink(local) ||
              Option(e.getMessage).exists(_.contains("NOFOLLOW_LINKS")) => throw link(Files.readSymbolicLink(local).toString)
        }
        new Opened(Channels.newInputStream(channel), if (withLength) channel.size() else -1L)
      } else {
        val status = if (fs.getScheme == "hdfs") Some(fs.getFileLinkStatus(path))
          else if (withLength) Some(fs.getFileStatus(path)) else None
        status.filter(_.isSymlink).foreach(s => throw link(s.getSymlink.toString))
        new Opened(hadoopOpen(path), status.fold(-1L)(_.getLen))
      }
    } catch {
      case e: CheckpointFileException => throw e
      case NonFatal(e) => throw unreadable(path, e)
    }
  }

  /**
   * The whole of an opened file of `kind` (its length known): refused, naming it, when it is
   * longer than `maxBytes`, before anything is allocated; read into one array of its length.
   * Checkpoint files are immutable once published, so a file that changes while read is refused.
   */
  def readAll(opened: Opened, path: Path, maxBytes: Long, kind: String): Array[Byte] = {
    if (opened.length > maxBytes) {
      throw new CheckpointFileException(s"keyedstate: $path has ${opened.length} bytes, more than a $kind may have " +
        s"($maxBytes): corrupt, or not a $kind; it is not read")
    }
    try {
      val data = new Array[Byte](opened.length.toInt)
      IOUtils.readFully(opened.in, data, 0, data.length)
      if (opened.in.read() != -1) throw new IOException(s"it grew beyond ${data.length} bytes while it was read")
      data
    } catch { case NonFatal(e) => throw unreadable(path, e) }
  }
}

private object LogHolder {
  val log = org.slf4j.LoggerFactory.getLogger(classOf[CheckpointFiles])
}

/** Failures of keyedstate's local working files, named as such (never as a checkpoint problem). */
object LocalDisk {
  def failed(path: java.nio.file.Path, e: IOException): LocalDiskException = {
    val full = Option(e.getMessage).exists(_.contains("No space left"))
    new LocalDiskException(s"keyedstate: cannot write $path on the executor's local disk" +
      (if (full) " (the local disk is full; the checkpoint is fine: free space and the task's retry continues)"
      else s" (${e.getMessage}); the checkpoint is not affected"), e)
  }
}
