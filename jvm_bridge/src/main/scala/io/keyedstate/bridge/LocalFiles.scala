package io.keyedstate.bridge

import java.io.IOException
import java.nio.channels.FileChannel
import java.nio.file._
import java.nio.file.attribute.{BasicFileAttributes, PosixFileAttributeView, PosixFilePermission, PosixFilePermissions}
import java.security.SecureRandom

import scala.jdk.CollectionConverters._

import org.slf4j.LoggerFactory

/**
 * keyedstate's local working files (state server directories, downloads, native readers): created
 * private to the user (0700 directories, 0600 files, whatever the process's umask), never at an
 * existing entry and never through a symbolic link; deleted without following links.
 */
object LocalFiles {
  private val log = LoggerFactory.getLogger(getClass)
  private val random = new SecureRandom()
  private val PrivateDir = PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------"))
  private val PrivateFile = PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------"))
  private val DirMode = PosixFilePermissions.fromString("rwx------")
  private val FileMode = PosixFilePermissions.fromString("rw-------")

  /** Deletes a file or a directory tree. A symbolic link is removed itself, never followed;
   *  entries that vanish meanwhile (another cleaner) are fine. */
  def deleteTree(path: Path): Unit =
    if (Files.exists(path, LinkOption.NOFOLLOW_LINKS)) {
      try Files.walkFileTree(path, new SimpleFileVisitor[Path] {
        override def visitFile(file: Path, attrs: BasicFileAttributes): FileVisitResult = {
          Files.deleteIfExists(file); FileVisitResult.CONTINUE
        }
        override def visitFileFailed(file: Path, e: IOException): FileVisitResult = {
          Files.deleteIfExists(file); FileVisitResult.CONTINUE
        }
        override def postVisitDirectory(dir: Path, e: IOException): FileVisitResult = {
          Files.deleteIfExists(dir); FileVisitResult.CONTINUE
        }
      }) catch { case _: NoSuchFileException => }
    }

  /** `dir` and its missing parents as directories private to the user (existing ones are used as
   *  they are, but the last must be a directory, not a link to one). */
  def createPrivateDirectories(dir: Path): Path = {
    val absolute = dir.toAbsolutePath
    if (!Files.isDirectory(absolute, LinkOption.NOFOLLOW_LINKS)) {
      Option(absolute.getParent).foreach(p => if (!Files.isDirectory(p)) createPrivateDirectories(p))
      try Files.createDirectory(absolute, PrivateDir)
      catch { case _: FileAlreadyExistsException if Files.isDirectory(absolute, LinkOption.NOFOLLOW_LINKS) => }
    }
    absolute
  }

  /** A directory that did not exist before (never an existing entry, never through a link), 0700. */
  def createNewPrivateDirectory(dir: Path): Path = {
    Files.createDirectory(dir, PrivateDir)
    chmod(dir, DirMode) // whatever the umask
    dir
  }

  /** A new private directory `<prefix><32 random hex digits>` in `parent`: unpredictable, and
   *  retried under another name if one exists. */
  def createUniquePrivateDirectory(parent: Path, prefix: String): Path = {
    var attempt = 0
    while (true) {
      try return createNewPrivateDirectory(parent.resolve(prefix + randomHex(16)))
      catch { case e: FileAlreadyExistsException if attempt < 8 => attempt += 1 }
    }
    throw new IllegalStateException("unreachable")
  }

  /** Opens a file for appending, creating it private; never through a symbolic link. */
  def openPrivateAppend(file: Path): FileChannel =
    FileChannel.open(file, Set[OpenOption](StandardOpenOption.CREATE, StandardOpenOption.WRITE,
      StandardOpenOption.APPEND, LinkOption.NOFOLLOW_LINKS).asJava, PrivateFile)

  private def chmod(path: Path, mode: java.util.Set[PosixFilePermission]): Unit =
    Files.getFileAttributeView(path, classOf[PosixFileAttributeView], LinkOption.NOFOLLOW_LINKS).setPermissions(mode)

  def randomHex(bytes: Int): String = {
    val b = new Array[Byte](bytes)
    random.nextBytes(b)
    b.map(x => f"${x & 0xff}%02x").mkString
  }

  private[bridge] def privateFileAttribute = PrivateFile
}
