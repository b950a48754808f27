package io.keyedstate.checkpoint

import java.io.{FileNotFoundException, InputStream, IOException}
import java.nio.channels.Channels
import java.nio.file.{Files, LinkOption, NoSuchFileException, StandardOpenOption}
import java.nio.file.attribute.BasicFileAttributes

import scala.util.control.NonFatal

import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.hadoop.io.IOUtils

/**
 * How every read of a checkpoint file in the JVM opens it and bounds it: no symbolic link
 * followed, a regular file only, and no more bytes than a file of its kind may have.
 */
object CheckpointReads {
  /** An open checkpoint file, and its length when it was asked for (else -1). */
  final class Opened(val in: InputStream, val length: Long)

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
