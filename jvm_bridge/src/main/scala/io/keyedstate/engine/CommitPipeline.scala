package io.keyedstate.engine

import java.nio.ByteBuffer

import scala.util.control.NonFatal

import org.slf4j.LoggerFactory

import io.keyedstate.checkpoint.{CheckpointFileException, CheckpointFiles}
import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, Frames, SplitChangelog, TtlScan}

/**
 * How the engine's commit makes a version's writes durable and applied: it encodes the changelog
 * (finished from the version's write buffer, compressed into its checkpoint file), writes that
 * file (the commit) and ships the changelog to the state server. Write-behind: when the key count
 * is exact without waiting for the server, the ship runs while the file is written, held
 * unapplied by the server until the file is durable, then applied behind; otherwise it follows
 * the write and is applied before the reply. The engine ([[StoreEngine.commit]]) decides which,
 * and owns the versions; this keeps the sizes the next commit starts with.
 */
private[engine] final class CommitPipeline(session: ServerSession, files: CheckpointFiles, fence: RunFence,
    describe: String) {
  import CommitPipeline._

  // Sizes the next version's write buffer starts with: the last commit's, so that it does not
  // grow (and copy) its index and changelog while a batch writes.
  @volatile private var expectedSizes = WriteBuffer.Expected.None
  // Room the next commit's compressed changelog starts with: the last one's and a margin (0: the
  // worst case, compressBound, as large as the changelog itself).
  private var expectedFileBytes = 0L

  def expected: WriteBuffer.Expected = expectedSizes

  /** The version's changelog, encoded as the writes happened, finished. */
  def finish(buffer: WriteBuffer): SplitChangelog = {
    val changelog = buffer.finish()
    if (buffer.size > 0) expectedSizes = buffer.observed.grown
    changelog
  }

  /** The checkpoint file of `changelog`. */
  def encode(changelog: SplitChangelog, meta: ChangelogMeta): ByteBuffer = {
    val file = ChangelogFormat.compress(changelog, meta, expectedFileBytes)
    val bytes = file.remaining().toLong
    expectedFileBytes = bytes + bytes / 4 + (64 << 10)
    file
  }

  /**
   * Writes `file` as `version`'s changelog and ships `changelog` to the server, write-behind
   * (`behind`) or one after the other. The server applies the changelog only if the file was
   * created by this commit ([[Shipped.created]]). `opened`: the file, opened ahead of the commit
   * unless that open was cancelled since.
   */
  def writeAndShip(version: Long, id: Option[String], fromEmpty: Boolean, changelog: SplitChangelog, file: ByteBuffer,
      scan: Option[TtlScan], behind: Boolean, opened: Option[CommitWrites.Opening]): Shipped = {
    files.ensureDirs()
    val path = files.changelog(version, id)
    // The file of an earlier run's attempt of this version is replaced, with its snapshot.
    val sync = session.settings.changelogSync
    val publish = () => opened.flatMap(_.take()).fold(files.createOnce(path, file, sync))(
      files.finishOnce(path, _, file, ChangelogFormat.filePrefix, sync)) ||
      rerunOf(version, id, fromEmpty).exists(seen =>
        files.replace(path, file, Seq(files.manifest(version, id)), seen, sync))
    val what = s"committing version $version of $describe"
    // Write-behind: the changelog is shipped, held unapplied by the server, while its file is
    // written; the commit then waits for the longer of the two, not their sum.
    if (behind) {
      val writing = CommitWrites.start(publish)
      // A task killed (interrupted) while it waits for the write interrupts the write too, and
      // the release or drop still reaches the server (an interrupted NIO channel closes); the
      // interrupt is then kept for Spark. Killed during the hold, the hold fails, and so does
      // the write.
      var interrupted = false
      def awaitWrite() = { val (r, i) = CommitWrites.await(writing); interrupted ||= i; r }
      try {
        val s0 = System.nanoTime()
        try session.data(what)((c, h) => c.apply(h, changelog, Frames.ApplyHold, scan))
        catch {
          case e: Throwable =>
            writing.interrupt() // the version fails: no need to wait for a whole write
            awaitWrite().left.foreach(e.addSuppressed)
            throw e
        }
        val s1 = System.nanoTime()
        val (written, wMs) = awaitWrite() match {
          case Right(r) => r
          case Left(e) => dropHeld(); throw e
        }
        val s2 = System.nanoTime()
        if (written) {
          try session.data(what)((c, h) => c.release(h, apply = true))
          catch { case e: Throwable => dropHeld(); throw e } // if the RELEASE never arrived, nothing stays held
        } else dropHeld()
        Shipped(written, wMs, 0L, (s1 - s0 + System.nanoTime() - s2) / 1000000)
      } finally if (interrupted) Thread.currentThread().interrupt()
    } else {
      val w0 = System.nanoTime()
      val written = publish()
      val w1 = System.nanoTime()
      val n = if (written) session.data(what)((c, h) => c.apply(h, changelog, Frames.ApplyNow, scan)) else 0L
      Shipped(written, (w1 - w0) / 1000000, n, (System.nanoTime() - w1) / 1000000)
    }
  }

  /**
   * Checks the changelog of `version` a commit found already in the checkpoint: another attempt
   * of this version in this run committed first (a retried or speculative task under checkpoint
   * format 1), or this one's file was published before its write failed (a killed task): the
   * file is the version, and loads take it from there. Fails when it is not: a file an offline
   * writer left uncommitted (a query's batch is no rerun of it, nor it of the batch), or one a
   * task of a stopped run wrote after this run replaced an earlier run's file.
   */
  def adoptFound(version: Long, id: Option[String], fromEmpty: Boolean): Unit = {
    val path = files.changelog(version, id)
    val found = files.readChangelogMeta(version, id)
    if (found.fromEmpty != fromEmpty) {
      val writer = if (fromEmpty) "by a batch of the query" else "from empty by an offline writer (migrate, the state processor or a repartition)"
      throw new CheckpointFileException(s"keyedstate: version $version of $describe is already in the checkpoint " +
        s"($path), written $writer that never committed: it is not this version. Delete its files " +
        s"($version.ks-*, or ${version}_<id>.ks-* under checkpoint format 2, in ${files.dir}) and retry")
    }
    // This run replaced an earlier run's file, and a task of a stopped run wrote its own in
    // the gap between the delete and the write: that attempt is not this run's version.
    if (fence.runId.isDefined && found.runId != fence.runId) {
      throw new CheckpointFileException(s"keyedstate: version $version of $describe: run ${fence.runId.get} " +
        s"replaced $path, but ${found.runId.fold("a writer without a run id")(r => s"run $r")} wrote its own file " +
        "there first (a task of a stopped run still committing); this task fails, and its retry replaces that file")
    }
    log.warn(s"keyedstate: version $version of $describe was already in the checkpoint; using that file")
  }

  /**
   * Whether the changelog of `version` a commit found in the checkpoint is an earlier run's
   * attempt, which Spark never committed and runs again (that run stopped or died between its
   * tasks' commits and its commit log), possibly over a changed query or other input. The
   * attempt Spark commits is the version, as Spark's own providers overwrite `<v>.delta` and
   * `<v>.changelog`: the caller replaces the file. An attempt of this run (a retried or
   * speculative task: the same batch over the same input) stays the version, and so does an
   * offline writer's file (the caller refuses it). Only the store's active instance replaces: a
   * provider of a stopped run fails instead of overwriting what the active run committed.
   * Some(the run id read in the file) when the caller replaces it: the replace re-checks it.
   */
  private def rerunOf(version: Long, id: Option[String], fromEmpty: Boolean): Option[Option[String]] =
    fence.runId.flatMap { run =>
      val found = files.readChangelogMeta(version, id)
      val writer = found.runId.fold("an earlier run")(r => s"run $r")
      if (found.fromEmpty != fromEmpty || found.runId.contains(run)) None
      else if (!fence.isActive) {
        throw new CheckpointFileException(s"keyedstate: version $version of $describe is in the checkpoint " +
          s"(${files.changelog(version, id)}), written by $writer, and this provider's run $run is not the store's " +
          "active instance: it does not replace the file")
      } else {
        log.warn(s"keyedstate: version $version of $describe was written by $writer, which Spark did not commit; " +
          s"run $run executes it again and replaces it")
        Some(found.runId)
      }
    }

  /** Drops the changelog a commit left held on the server (its file was not written, or another
   *  attempt's was), best effort: the caller invalidates or fails anyway, and a reload's restore
   *  drops whatever is still held. */
  private def dropHeld(): Unit =
    try session.data(s"dropping an unwritten version of $describe")((c, h) => c.release(h, apply = false))
    catch { case NonFatal(e) => log.info(s"keyedstate: no held changelog of $describe dropped (${e.getMessage}); the reload drops any") }
}

private[engine] object CommitPipeline {
  private val log = LoggerFactory.getLogger(classOf[CommitPipeline])

  /** A commit's write and ship: whether this commit created the file, the write's ms, the keys
   *  the server counted (applied before the reply; 0 write-behind) and the ship's ms. */
  final case class Shipped(created: Boolean, writeMs: Long, counted: Long, shipMs: Long)
}
