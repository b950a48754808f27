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
 * server's log level.
 */
private[bridge] final class ServerLog(val path: Path) {
  import ServerLog._

  @volatile private var out: FileChannel = LocalFiles.openPrivateAppend(path)
  @volatile private var thread: Thread = _

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
        if (n > 0) write(buf, n)
        n = in.read(buf)
      }
    } catch { case NonFatal(_) => }
    finally close()
  }

  private def write(buf: Array[Byte], n: Int): Unit = {
    if (out.size() + n > MaxBytes) {
      out.close()
      Files.move(path, backup, StandardCopyOption.REPLACE_EXISTING)
      out = LocalFiles.openPrivateAppend(path)
    }
    val b = ByteBuffer.wrap(buf, 0, n)
    while (b.hasRemaining) out.write(b)
  }

  private def backup: Path = path.resolveSibling(path.getFileName.toString + ".1")

  /** Waits (a little) until the server's last words are written. */
  def awaitEnd(ms: Long): Unit = Option(thread).foreach(_.join(ms))

  def close(): Unit = try out.close() catch { case NonFatal(_) => }

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
