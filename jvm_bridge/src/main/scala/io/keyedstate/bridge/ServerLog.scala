package io.keyedstate.bridge

import java.io.InputStream
import java.nio.ByteBuffer
import java.nio.channels.FileChannel
import java.nio.charset.StandardCharsets
import java.nio.file.{Files, LinkOption, Path, StandardCopyOption}

import scala.util.control.NonFatal

/**
 * What a state server writes to stdout and stderr (its log), copied by a daemon thread into
 * `path`, a private file rotated to `path.1` at [[ServerLog.MaxBytes]]: bounded, whatever the
 * server's log level. The thread drains the server's output until it ends, whatever happens to
 * the file: output it cannot write (a full disk, a removed directory) is dropped and counted, and
 * the first write that works again says how much was lost. A server whose output nobody reads
 * blocks on its pipe.
 */
private[bridge] final class ServerLog(val path: Path) {
  import ServerLog._

  @volatile private var out: FileChannel = LocalFiles.openPrivateAppend(path)
  @volatile private var thread: Thread = _
  @volatile private var closed = false
  /** Bytes of output dropped since the last write that worked, and why the first was. */
  private var dropped = 0L
  private var dropReason = ""

  def pump(in: InputStream, name: String): Unit = {
    val t = new Thread(() => copy(in), name)
    t.setDaemon(true)
    thread = t
    t.start()
  }

  private def copy(in: InputStream): Unit = {
    val buf = new Array[Byte](8192)
    try {
      var n = in.read(buf)
      while (n >= 0) {
        if (n > 0) writeOrDrop(buf, n)
        n = in.read(buf)
      }
    } catch { case NonFatal(_) => } // the pipe itself failed: the server is gone
    finally close()
  }

  /** Writes `n` bytes, else drops and counts them; after drops, the first write that works is
   *  preceded by a line saying how many bytes were lost and why. */
  private def writeOrDrop(buf: Array[Byte], n: Int): Unit =
    try {
      if (dropped > 0) {
        val note = s"\n[keyedstate: $dropped bytes of this server's output were dropped: writing $path failed ($dropReason)]\n"
        val bytes = note.getBytes(StandardCharsets.UTF_8)
        write(bytes, bytes.length)
        dropped = 0
      }
      write(buf, n)
    } catch {
      case NonFatal(e) =>
        if (dropped == 0) dropReason = Option(e.getMessage).getOrElse(e.getClass.getName)
        dropped += n
    }

  private def write(bytes: Array[Byte], n: Int): Unit = {
    if (out == null || !out.isOpen) {
      if (closed) throw new java.io.IOException("the log is closed")
      out = LocalFiles.openPrivateAppend(path) // after a failed rotation, or a failed open
    }
    if (out.size() + n > MaxBytes) {
      out.close()
      Files.move(path, backup, StandardCopyOption.REPLACE_EXISTING)
      out = LocalFiles.openPrivateAppend(path)
    }
    val b = ByteBuffer.wrap(bytes, 0, n)
    while (b.hasRemaining) out.write(b)
  }

  private def backup: Path = path.resolveSibling(path.getFileName.toString + ".1")

  /** Waits (a little) until the server's last words are written. */
  def awaitEnd(ms: Long): Unit = Option(thread).foreach(_.join(ms))

  def close(): Unit = { closed = true; try out.close() catch { case NonFatal(_) => } }

  /** The last lines of the log, for error messages (reads at most the last 32 KB). */
  def tail(lines: Int = 20): String =
    try {
      val text = Seq(backup, path).filter(p => Files.isRegularFile(p, LinkOption.NOFOLLOW_LINKS)).map(lastBytes).mkString
      val all = text.split("\n")
      "\n--- last lines of the server log ---\n" + all.takeRight(lines).mkString("\n")
    } catch { case NonFatal(_) => "" }

  private def lastBytes(p: Path): String = {
    val ch = FileChannel.open(p)
    try {
      val n = math.min(ch.size(), TailBytes.toLong).toInt
      val b = ByteBuffer.allocate(n)
      ch.position(ch.size() - n)
      while (b.hasRemaining && ch.read(b) >= 0) {}
      new String(b.array(), 0, b.position(), StandardCharsets.UTF_8)
    } finally ch.close()
  }
}

private[bridge] object ServerLog {
  val Name = "server.log"
  val MaxBytes: Long = 8L << 20
  private val TailBytes = 32 << 10
}
