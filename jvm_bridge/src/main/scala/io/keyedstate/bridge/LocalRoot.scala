package io.keyedstate.bridge

import java.nio.channels.{FileChannel, FileLock, OverlappingFileLockException}
import java.nio.charset.StandardCharsets
import java.nio.file._

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.slf4j.LoggerFactory

/**
 * This JVM's directory of keyedstate files, `<parent>/keyedstate-<random>`, held by a lock file
 * the JVM keeps locked ([[FileChannel.lock]]) while it lives. Creating one first removes the
 * directories of JVMs that are gone (killed, crashed): siblings named like it whose lock can be
 * taken. Safe with several JVMs sharing `parent` (a localDir shared by executors, containers
 * whose pids collide): a live JVM's lock cannot be taken, and a lock file is locked before it
 * gets its name, so no cleaner sees it unlocked.
 */
final class LocalRoot private (val dir: Path, channel: FileChannel, lock: FileLock) {
  /** Releases the lock and deletes the directory (at the JVM's exit). */
  def close(): Unit = {
    LocalFiles.deleteTree(dir)
    try lock.release() catch { case NonFatal(_) => }
    try channel.close() catch { case NonFatal(_) => }
  }
}

object LocalRoot {
  private val log = LoggerFactory.getLogger(classOf[LocalRoot])
  val Prefix = "keyedstate-"
  private val Name = "keyedstate-[0-9a-f]{32}".r
  private val SocketDirName = "ks-[0-9a-f]{16}".r
  val LockName = "jvm.lock"
  /** Where a state server names the data socket directory it made outside its work dir. */
  val SocketDirMarker = "socket-dir"

  def create(parent: Path): LocalRoot = {
    val base = LocalFiles.createPrivateDirectories(parent)
    val dir = LocalFiles.createUniquePrivateDirectory(base, Prefix)
    val pending = dir.resolve("." + LockName + ".new")
    val channel = FileChannel.open(pending, Set[OpenOption](StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE,
      LinkOption.NOFOLLOW_LINKS).asJava, LocalFiles.privateFileAttribute)
    val lock = channel.lock()
    Files.move(pending, dir.resolve(LockName), StandardCopyOption.ATOMIC_MOVE)
    val root = new LocalRoot(dir, channel, lock)
    removeAbandoned(base, dir)
    root
  }

  /** Deletes the keyedstate directories in `base` whose JVM is gone (their lock can be taken). */
  private def removeAbandoned(base: Path, own: Path): Unit = {
    val owner = Files.getOwner(own, LinkOption.NOFOLLOW_LINKS)
    val candidates = try {
      val stream = Files.list(base)
      try stream.iterator().asScala.toList finally stream.close()
    } catch { case NonFatal(_) => Nil }
    val removed = candidates.filter { c =>
      c != own && Name.matches(c.getFileName.toString) && Files.isDirectory(c, LinkOption.NOFOLLOW_LINKS) &&
        (try Files.getOwner(c, LinkOption.NOFOLLOW_LINKS) == owner catch { case NonFatal(_) => false }) &&
        removeIfAbandoned(c)
    }
    if (removed.nonEmpty) {
      log.info(s"keyedstate: removed ${removed.size} local directories left by JVMs that are gone: ${removed.mkString(", ")}")
    }
  }

  private def removeIfAbandoned(dir: Path): Boolean = {
    val lockFile = dir.resolve(LockName)
    if (!Files.isRegularFile(lockFile, LinkOption.NOFOLLOW_LINKS)) return false // being created, or not ours
    try {
      val channel = FileChannel.open(lockFile, Set[OpenOption](StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS).asJava)
      try {
        val lock = try channel.tryLock() catch { case _: OverlappingFileLockException => null }
        if (lock == null) false // its JVM lives
        else {
          try { removeSocketDirs(dir); LocalFiles.deleteTree(dir) } finally lock.release()
          true
        }
      } finally channel.close()
    } catch {
      case NonFatal(e) =>
        log.warn(s"keyedstate: could not remove the abandoned local directory $dir: $e")
        false
    }
  }

  /** The data socket directories the dead JVM's servers made outside its directory (named in
   *  their work dirs; only `ks-<16 hex>` directories owned by the user, never through a link). */
  private[bridge] def removeSocketDirs(dir: Path): Unit = {
    val owner = Files.getOwner(dir, LinkOption.NOFOLLOW_LINKS)
    val stream = Files.list(dir)
    try stream.iterator().asScala.foreach(server => removeSocketDir(server, owner))
    finally stream.close()
  }

  private[bridge] def removeSocketDir(workDir: Path, owner: java.nio.file.attribute.UserPrincipal): Unit = {
    val marker = workDir.resolve(SocketDirMarker)
    if (Files.isRegularFile(marker, LinkOption.NOFOLLOW_LINKS)) {
      try {
        val socketDir = Paths.get(new String(Files.readAllBytes(marker), StandardCharsets.UTF_8).trim)
        if (socketDir.isAbsolute && SocketDirName.matches(socketDir.getFileName.toString) &&
            Files.isDirectory(socketDir, LinkOption.NOFOLLOW_LINKS) &&
            Files.getOwner(socketDir, LinkOption.NOFOLLOW_LINKS) == owner) {
          LocalFiles.deleteTree(socketDir)
        }
      } catch { case NonFatal(_) => }
    }
  }
}
