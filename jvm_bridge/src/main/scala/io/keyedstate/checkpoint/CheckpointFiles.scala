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
import org.apache.hadoop.fs.{FileStatus, FileSystem, Path, StreamCapabilities}
import org.apache.hadoop.io.IOUtils
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager

import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, CheckpointLayout, CorruptChangelogException,
  CorruptManifestException, ManifestFormat, SnapshotFile, SnapshotManifest, UnsafePathException}

/**
 * One store partition's checkpoint directory ([[CheckpointLayout]]), through Spark's
 * `CheckpointFileManager` (the one `spark.sql.streaming.checkpointFileManagerClass` names, or
 * Spark's default for the scheme), so that every checkpoint location Spark accepts works, object
 * stores included (Spark's `RocksDBFileManager` is the model): listing versions, reading and
 * writing changelogs and manifests, uploading and downloading snapshot files, cleanup. Hadoop's
 * own `file:` system is swapped for one that starts no processes ([[ForklessLocalFileSystem]]).
 *
 * A changelog or manifest appears whole under its final name (`createAtomic`; snapshot files are
 * read only once a manifest lists them, [[upload]]), and a committed file is never
 * replaced or deleted before nothing needs it: a second writer of the same name finds it there
 * and keeps it ([[createOnce]]), so there is no moment in which a committed version is absent.
 * Only an attempt Spark never committed is replaced ([[replace]]).
 */
final class CheckpointFiles(val dir: Path, hadoopConf: Configuration, defaultStore: Boolean) {
  def this(dir: Path, hadoopConf: Configuration) = this(dir, hadoopConf, true) // the store `default`

  private val conf = ForklessLocalFileSystem.confFor(dir, hadoopConf)
  private val fm = CheckpointFileManager.create(dir, conf)
  private lazy val fs = dir.getFileSystem(conf) // what the manager lacks: stat, plain and conditional creates
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
   *
   * `seenRun` is the run id the caller read in the old file's header when it decided to replace
   * it: right before each delete the header is read again, and a file another run wrote meanwhile
   * (it may be the version Spark committed) fails the call, deleting nothing more. `sync`: as
   * for [[createOnce]].
   */
  def replace(path: Path, data: ByteBuffer, derived: Seq[Path], seenRun: Option[String], sync: Boolean): Boolean = {
    val recheck = () => if (exists(path)) {
      val now = readChangelogMetaAt(path).runId
      if (now != seenRun) {
        def who(r: Option[String]) = r.fold("a writer without a run id")(id => s"run $id")
        throw new CheckpointFileException(s"keyedstate: $path in the checkpoint was written by ${who(now)} after " +
          s"this task found ${who(seenRun)}'s file there and chose to replace it: it does not delete a file it did " +
          "not read; this task fails, and a retry decides again")
      }
    }
    val deleteAll = (paths: Seq[Path]) => paths.foreach { p =>
      try fm.delete(p) catch {
        case NonFatal(e) =>
          throw new CheckpointFileException(s"keyedstate: cannot delete $p from the checkpoint: ${e.getMessage}", e)
      }
    }
    recheck()
    deleteAll(derived)
    recheck()
    deleteAll(Seq(path))
    val created = createOnce(path, data, sync)
    // The earlier run's upload may have published a derived file while `path` was absent (it
    // takes an absent changelog as its own): gone again once this attempt's file is there.
    if (created) deleteAll(derived)
    created
  }

  /**
   * Writes `path` atomically unless a file of that name exists; returns false (and leaves the
   * existing file untouched) when it does: another attempt of the same version was first. So
   * does a close that fails once the file is there: on an object store a rename copies, then
   * deletes, and a task killed in between leaves this attempt's own complete file. `sync`:
   * hsync before the close (manifests always; changelogs per the changelogSync conf).
   */
  def createOnce(path: Path, data: ByteBuffer, sync: Boolean): Boolean =
    finishOnce(path, openOnce(path), data, Array.emptyByteArray, sync)

  /**
   * Opens `path` for [[finishOnce]], which may follow much later: nothing is published until it
   * does (a temporary file, or an object store's pending upload), and `cancel()` drops it. The
   * open is where a store spends its create requests (s3a's probes, HDFS's NameNode create).
   */
  def openOnce(path: Path, prefix: Array[Byte] = Array.emptyByteArray): CheckpointFileManager.CancellableFSDataOutputStream = {
    val direct = if (publishesAtClose) openPublishedAtClose(path) else None
    if (direct.isDefined) return direct.get
    // No probe first: the rename that publishes the file refuses an existing one (Spark's
    // createAtomic without overwrite), and finishOnce's close tells that case apart.
    val out = try fm.createAtomic(path, false) catch { case NonFatal(e) => throw unwritable(path, e) }
    // Where hsync reaches storage (HDFS), the file's first bytes, known now, set up its write
    // pipeline and block (the NameNode's addBlock and fsync) here rather than in the commit.
    // That is an optimisation only: if it fails, the file is opened again with nothing written
    // ahead, and the commit writes it whole.
    if (prefix.nonEmpty && out.hasCapability(StreamCapabilities.HSYNC)) {
      try { out.write(prefix); out.hsync() } catch {
        case NonFatal(e) =>
          try out.cancel() catch { case NonFatal(_) => }
          if (Thread.currentThread().isInterrupted || isInterruption(e)) throw unwritable(path, e)
          LogHolder.log.info(s"keyedstate: writing the first bytes of $path ahead of its commit failed; " +
            s"opening it again with nothing written ahead ($e)")
          return openOnce(path)
      }
    }
    out
  }

  /**
   * Whether a file can be written under its final name, as [[createOnce]] requires, without a
   * temporary name and its rename (on an object store a copy and a delete): where the store
   * publishes a file whole at its close, refuses that close when the name exists (S3's
   * conditional PUT, through s3a; its `fs.s3a.create.conditional.enabled` turns it off for a
   * store that lacks it), and can abort a stream, which then publishes nothing. Not where the
   * user chose a checkpoint file manager of their own.
   */
  private lazy val publishesAtClose: Boolean = !localDisk &&
    hadoopConf.get(CheckpointFiles.FileManagerClassConf) == null && {
      try Seq(CheckpointFiles.CreateInClose, CheckpointFiles.ConditionalCreate, StreamCapabilities.ABORTABLE_STREAM)
        .forall(fs.hasPathCapability(dir, _))
      catch { case NonFatal(_) => false }
    }

  /** `path` opened under its final name with a create that the store refuses at the close if
   *  the name exists; None if this stream cannot do that after all (then createAtomic serves). */
  private def openPublishedAtClose(path: Path): Option[CheckpointFileManager.CancellableFSDataOutputStream] = {
    // The create needs no probe of the name (s3a skips its HEAD and LIST): the close decides.
    val out = try fs.createFile(path).overwrite(false).recursive()
      .opt(CheckpointFiles.ConditionalCreate, true).opt(CheckpointFiles.S3aCreatePerformance, true).build()
    catch { case NonFatal(e) => throw unwritable(path, e) }
    if (out.hasCapability(CheckpointFiles.ConditionalCreate)) Some(new PublishedAtClose(out))
    else {
      try { out.abort(); () } catch { case NonFatal(_) => }
      None
    }
  }

  private def isInterruption(e: Throwable): Boolean =
    e.isInstanceOf[java.io.InterruptedIOException] || e.isInstanceOf[java.nio.channels.ClosedByInterruptException]

  /** Writes `data` to `out` (opened by [[openOnce]] for `path` with `prefix`, which it may have
   *  written already: `data` must begin with it) and publishes it, as [[createOnce]]; `sync`:
   *  hsync before the close (the changelogSync conf; a close alone is what Spark's providers do). */
  def finishOnce(path: Path, out: CheckpointFileManager.CancellableFSDataOutputStream, data: ByteBuffer,
      prefix: Array[Byte], sync: Boolean): Boolean = {
    var written = 0L
    try {
      written = out.getPos
      val start = data.arrayOffset() + data.position()
      if (written != 0 && (written != prefix.length || data.remaining() < prefix.length ||
          !java.util.Arrays.equals(data.array(), start, start + prefix.length, prefix, 0, prefix.length))) {
        throw new IllegalStateException(s"keyedstate: the $written bytes written ahead are not the file's first")
      }
      out.write(data.array(), start + written.toInt, data.remaining() - written.toInt)
      if (sync) out.hsync()
    } catch {
      case NonFatal(e) =>
        try out.cancel() catch { case NonFatal(_) => }
        // A stream opened ahead has sat idle since its first bytes (HDFS: its pipeline may have
        // lost a DataNode it cannot replace): one fresh write, unless the task is being killed.
        if (written == 0 || Thread.currentThread().isInterrupted || isInterruption(e)) throw unwritable(path, e)
        LogHolder.log.info(s"keyedstate: writing $path through the stream opened ahead of its commit failed; " +
          s"writing it again through a new one ($e)")
        return createOnce(path, data, sync)
    }
    try { out.close(); true } catch {
      case NonFatal(e) if exists(path) =>
        LogHolder.log.info(s"keyedstate: $path exists after its write failed (another attempt's, or this one's " +
          s"published before the failure); keeping it ($e)")
        false
      case NonFatal(e) => throw unwritable(path, e)
    }
  }

  /** Whether a commit opens its changelog when its version starts ([[openOnce]]): off a local
   *  disk, where a create costs requests; a local create is cheap and would only add a file. */
  def opensAhead: Boolean = !localDisk

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

  private def open(path: Path, withLength: Boolean = false): CheckpointReads.Opened =
    CheckpointReads.open(fs, path, withLength)(fm.open(_))

  /** Copies a checkpoint file to local disk; a failure says which side failed. */
  def download(path: Path, local: java.nio.file.Path): Unit = {
    val in = open(path).in
    try copy(in, path, local) finally in.close()
  }

  /**
   * A file no one writes once it exists (a snapshot's RocksDB table file: RocksDB only reads its
   * table files, and deletes only its own name for one) to local disk: on a local-disk checkpoint
   * a hard link when the local directory is on its file system, else a copy ([[download]]). Only
   * a regular file (not followed if a link) is linked, and the link must be that very file (device
   * and inode): anything else, or anything swapped in meanwhile, goes to [[download]], whose open
   * refuses it by name. The checkpoint's file is then the store's own: it must never be rewritten
   * in place (keyedstate writes every checkpoint file under a new name).
   */
  def downloadUnchanging(path: Path, local: java.nio.file.Path): Unit = {
    if (localDisk) {
      val source = java.nio.file.Paths.get(fs.makeQualified(path).toUri)
      def identity(p: java.nio.file.Path) = {
        val a = Files.readAttributes(p, classOf[BasicFileAttributes], LinkOption.NOFOLLOW_LINKS)
        if (a.isRegularFile) Option(a.fileKey) else None
      }
      val linked = try identity(source).exists { checked =>
        Files.createLink(local, source)
        identity(local).contains(checked)
      } catch {
        case _: IOException | _: UnsupportedOperationException => false // another file system, or links refused
      }
      if (linked) return
      try Files.deleteIfExists(local) catch { case e: IOException => throw LocalDisk.failed(local, e) }
    }
    download(path, local)
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

  private def unreadable(path: Path, e: Throwable) = CheckpointReads.unreadable(path, e)

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

  /**
   * Copies a local file into the checkpoint as the snapshot file `path` (a name no one else uses,
   * [[newSnapshotFilePath]]). Off a local disk it is written under that name directly: no
   * temporary name, no rename (which is a copy and a delete on object stores). That is safe for
   * snapshot files alone: one is read only once a manifest lists it, and a manifest is written
   * after its files' writes returned, so a partial file (a write in progress, or a killed one on a
   * store that shows files before they are closed) is listed by no manifest; cleanup deletes such
   * a file once it is older than the manifest it keeps as its base ([[CheckpointCleanup]]), as it
   * does a temporary file. A local disk keeps `createAtomic`: its rename is atomic and cheap, and
   * Hadoop's local file system would write a checksum file beside a plain one.
   */
  def upload(local: java.nio.file.Path, path: Path): Unit = {
    val (out, abandon) = try {
      if (localDisk) {
        val atomic = fm.createAtomic(path, false)
        (atomic, () => atomic.cancel())
      } else {
        // The name is new: s3a skips its probes of it (a HEAD and a LIST); other stores ignore the option.
        val plain = fs.createFile(path).overwrite(false).recursive().opt(CheckpointFiles.S3aCreatePerformance, true).build()
        (plain, () => abandoned(plain, path))
      }
    } catch { case NonFatal(e) => throw unwritable(path, e) }
    try {
      Files.copy(local, out)
      out.close()
    } catch {
      case NonFatal(e) =>
        try abandon() catch { case NonFatal(_) => }
        throw unwritable(path, e)
    }
  }

  /** Ends a plain write that failed: an object store publishes nothing (an aborted stream, never
   *  closed); a file system shows what was written, deleted here (by cleanup if this fails too). */
  private def abandoned(out: org.apache.hadoop.fs.FSDataOutputStream, path: Path): Unit =
    if (out.hasCapability(StreamCapabilities.ABORTABLE_STREAM)) out.abort()
    else {
      try out.close() catch { case NonFatal(_) => }
      fs.delete(path, false)
    }

  /** Whether a snapshot file is in the checkpoint with the size a manifest says. */
  def holds(f: SnapshotFile): Boolean =
    try { val s = fs.getFileStatus(resolve(f.path)); s.isFile && s.getLen == f.size } catch { case NonFatal(_) => false }

  /** A whole checkpoint file of `kind`, refused unread when it has more than `maxBytes` bytes
   *  ([[CheckpointReads.readAll]]). */
  def readBytes(path: Path, maxBytes: Long, kind: String): Array[Byte] = {
    val opened = open(path, withLength = true)
    try CheckpointReads.readAll(opened, path, maxBytes, kind) finally opened.in.close()
  }

  /** The metadata of a changelog, from its header alone (format 1: none). */
  def readChangelogMeta(version: Long, id: Option[String]): ChangelogMeta = readChangelogMetaAt(changelog(version, id))

  private def readChangelogMetaAt(path: Path): ChangelogMeta = {
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
    createOnce(manifest(m.version, id), ByteBuffer.wrap(ManifestFormat.encode(m)), sync = true)

  def delete(path: Path): Unit = fm.delete(path)

  def newSnapshotFilePath(localName: String): (String, Path) = {
    val rel = s"${filesDir.getName}/${UUID.randomUUID()}-$localName"
    (rel, new Path(dir, rel))
  }

  val paths = new PartitionPaths(dir, defaultStore) // this partition's and its siblings' file paths
  /** A path a manifest lists; a lender's directories are checked for links as [[listing]] checks these. */
  def resolve(relative: String): Path = { val p = paths.resolve(relative); if (p.getParent != filesDir) refuseLinks(p.getParent); p }
  def sibling(p: Int): CheckpointFiles = new CheckpointFiles(paths.storeDirOf(p), conf, defaultStore)

  /** The snapshot files directory's entries that are keyedstate's (a name a manifest can list,
   *  or Hadoop's `.<name>.crc` beside one): relative path -> (size, modification time). Any other
   *  name (a desktop's `.DS_Store`) is no snapshot file: no cleanup deletes it or waits for it. */
  def snapshotFiles(): Map[String, (Long, Long)] =
    list(filesDir).filter(s => s.isFile && CheckpointFiles.snapshotFileName(s.getPath.getName)).map { s =>
      s"${filesDir.getName}/${s.getPath.getName}" -> (s.getLen, s.getModificationTime)
    }.toMap

  /** An entry [[snapshotFiles]] names (its checksum files too, which [[resolve]] refuses). */
  def snapshotFile(rel: String): Path = new Path(dir, rel)
}

object CheckpointFiles {
  /** The most bytes a file of each kind may have (FORMATS.md, "File sizes"; Python's twin is
   *  `formats/layout.py`): a longer one is refused, naming it, before its bytes are allocated. */
  val MaxManifestBytes: Long = 16L << 20
  val MaxSparkMetadataBytes: Long = 16L << 20
  val MaxChangelogBytes: Long = ChangelogFormat.MaxBytes

  /** Whether a failed read found no file: the open tells, so no existence probe goes first. */
  def missing(e: CheckpointFileException): Boolean = e.getCause.isInstanceOf[FileNotFoundException]

  private val Checksum = """\.(.+)\.crc""".r
  /** The file an entry [[snapshotFiles]] names stands for: the file itself, or the one beside a
   *  checksum file (`ks-files/.<name>.crc` -> `ks-files/<name>`). */
  def checksummed(rel: String): String = rel.split('/') match {
    case Array(dir, Checksum(main)) => s"$dir/$main"
    case _ => rel
  }
  /** Whether `name` in `ks-files/` is a snapshot file's a manifest can list, or its checksum. */
  def snapshotFileName(name: String): Boolean = {
    def listable(n: String) = !n.contains("..") && CheckpointLayout.RelativePath.matches(s"${CheckpointLayout.FilesDir}/$n")
    name match {
      case Checksum(main) => listable(main)
      case _ => listable(name)
    }
  }

  /** s3a's create option that skips its probes of the path (an optional one: other stores ignore it). */
  private val S3aCreatePerformance = "fs.s3a.create.performance"
  /** Hadoop's create option (and path capability) of a close refused when the name exists. */
  private val ConditionalCreate = "fs.option.create.conditional.overwrite"
  /** Hadoop's path capability of a store whose created file appears only at its close. */
  private val CreateInClose = "fs.option.create.in.close"
  /** The Spark conf naming a checkpoint file manager class (Spark passes it in the Hadoop conf). */
  private[checkpoint] val FileManagerClassConf = "spark.sql.streaming.checkpointFileManagerClass"
}

/** A file written under its final name that appears at the close ([[CheckpointFiles.openOnce]]
 *  on a store that publishes at close); cancel aborts the write, so nothing appears. */
private final class PublishedAtClose(out: org.apache.hadoop.fs.FSDataOutputStream)
    extends CheckpointFileManager.CancellableFSDataOutputStream(out) {
  override def cancel(): Unit = { out.abort(); () }
  override def close(): Unit = out.close()
}

private object LogHolder {
  val log = org.slf4j.LoggerFactory.getLogger(classOf[CheckpointFiles])
}
