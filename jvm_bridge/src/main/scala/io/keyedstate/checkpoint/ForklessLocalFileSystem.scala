package io.keyedstate.checkpoint

import java.io.IOException
import java.net.URI
import java.nio.file.Files

import scala.util.Try

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{ChecksumFs, DelegateToFileSystem, FileStatus, FileSystem, FsConstants,
  FsServerDefaults, LocalFileSystem, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.local.LocalConfigKeys
import org.apache.hadoop.fs.permission.FsPermission

/**
 * Hadoop's local file system (`file:`), except that permissions are set with java.nio instead of
 * a `chmod` child process, and a path is told from a symbolic link without a `readlink` one.
 * Without Hadoop's native library (pyspark ships none) Hadoop forks `chmod` for every file and
 * checksum file it creates, and `readlink` for every path a FileContext rename resolves: about
 * 10 processes per checkpoint file. Same files, bytes, modes and statuses as Hadoop's own.
 *
 * keyedstate's checkpoint files go through it when the checkpoint is on `file:` and the Hadoop
 * conf names Hadoop's own local file system ([[ForklessLocalFileSystem.confFor]]); Spark's own
 * files are left to the file system Spark is configured with.
 */
class ForklessLocalFileSystem extends LocalFileSystem(new ForklessLocalFileSystem.Raw)

object ForklessLocalFileSystem {
  /** RawLocalFileSystem whose setPermission and getFileLinkStatus start no process. */
  class Raw extends RawLocalFileSystem {
    /** As Hadoop's `chmod` with a 4-digit mode does: that mode exactly, except that a directory
     *  keeps its set-user-ID and set-group-ID bits (GNU chmod's rule; a shared group's setgid). */
    override def setPermission(p: Path, permission: FsPermission): Unit = {
      val path = pathToFile(p).toPath
      val kept = if (Files.isDirectory(path)) Files.getAttribute(path, "unix:mode").asInstanceOf[Int] & 0xc00 else 0
      Files.setAttribute(path, "unix:mode", Integer.valueOf((permission.toShort & 0x3ff) | kept))
    }

    /** A path that is not a link has its own status, as in Hadoop's implementation. */
    @throws[IOException]
    override def getFileLinkStatus(f: Path): FileStatus =
      if (Files.isSymbolicLink(pathToFile(f).toPath)) super.getFileLinkStatus(f) else getFileStatus(f)
  }

  /** `fs.AbstractFileSystem.file.impl` (FileContext): Hadoop's LocalFs over [[Raw]]. */
  class Fs(uri: URI, conf: Configuration) extends ChecksumFs(new RawFs(uri, conf))

  /** Hadoop's RawLocalFs over [[Raw]] (which, like it, ignores the URI it is given). */
  class RawFs(uri: URI, conf: Configuration)
      extends DelegateToFileSystem(FsConstants.LOCAL_FS_URI, new Raw, conf, FsConstants.LOCAL_FS_URI.getScheme, false) {
    override def getUriDefaultPort: Int = -1
    override def getServerDefaults: FsServerDefaults = LocalConfigKeys.getServerDefaults
    override def getServerDefaults(f: Path): FsServerDefaults = LocalConfigKeys.getServerDefaults
    override def isValidName(src: String): Boolean = true // any local path is valid, as RawLocalFs says
  }

  private val FileImpl = "fs.file.impl"
  private val ContextFileImpl = "fs.AbstractFileSystem.file.impl"
  private val HadoopContextFileImpl = "org.apache.hadoop.fs.local.LocalFs"
  /** What `file:` is found as without `fs.file.impl`: Hadoop's, or Hive's (pyspark's Hive jars
   *  register their LocalFileSystem, which Hadoop then finds last). Another found is kept. */
  private val HadoopFileImpls = Set(classOf[LocalFileSystem].getName, "org.apache.hadoop.hive.ql.io.ProxyLocalFileSystem")
  /** The copy made of each conf: Spark hands every store of a query's operator the same one, and
   *  builds a new one per query (a conf changed after its first use is not seen again). */
  private val derived = java.util.Collections.synchronizedMap(new java.util.WeakHashMap[Configuration, Configuration]())

  /**
   * The Hadoop conf for keyedstate's files under `dir`: for a `file:` directory whose conf leaves
   * `file:` to Hadoop's own local file system by default (`fs.file.impl` unset: setting it, even
   * to Hadoop's class, keeps Hadoop's) and names no checkpoint file manager of its own, a copy
   * that names these classes, uncached (FileSystem's cache is keyed by scheme, not by class: a
   * cached instance would serve Spark's own files too); otherwise `conf` itself.
   */
  def confFor(dir: Path, conf: Configuration): Configuration = {
    val scheme = Option(dir.toUri.getScheme).getOrElse(FileSystem.getDefaultUri(conf).getScheme)
    val hadoops = scheme == "file" && conf.get(CheckpointFiles.FileManagerClassConf) == null &&
      conf.get(FileImpl) == null && Option(conf.get(ContextFileImpl)).forall(_ == HadoopContextFileImpl) &&
      Try(FileSystem.getFileSystemClass("file", conf).getName).toOption.exists(HadoopFileImpls)
    if (hadoops) derived.computeIfAbsent(conf, (c: Configuration) => forkless(c)) else conf
  }

  private def forkless(conf: Configuration): Configuration = {
    val copy = new Configuration(conf)
    copy.setClassLoader(classOf[ForklessLocalFileSystem].getClassLoader) // spark.jars' loader
    copy.set(FileImpl, classOf[ForklessLocalFileSystem].getName)
    copy.setBoolean("fs.file.impl.disable.cache", true)
    copy.set(ContextFileImpl, classOf[Fs].getName)
    copy
  }
}
