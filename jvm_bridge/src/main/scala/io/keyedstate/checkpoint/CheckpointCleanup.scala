package io.keyedstate.checkpoint

import java.io.IOException

import scala.util.control.NonFatal

import org.slf4j.LoggerFactory

import io.keyedstate.format.CheckpointLayout

/**
 * Deletes what no retained version needs, and never what could still rebuild one: the oldest
 * retained version is rebuilt from the newest snapshot at or below it whose files are all in the
 * checkpoint with their sizes and that is of its version's attempt (a *verified* snapshot),
 * plus the changelogs after it; only changelogs at or below that snapshot, older manifests, and
 * snapshot files no kept manifest lists go, unless a partition this one lent them to lists them
 * ([[SharedFiles]]). A newer snapshot that turns out broken (say an overlapping run listed a file
 * that is gone) costs a longer replay on load, never the version.
 *
 * Retention counts back from `head`, the version the caller committed or loaded, never from the
 * newest file listed: that may be an attempt Spark never committed (a run stopped between a
 * task's commit and Spark's commit log), and counting from it would delete what rebuilds the
 * version the restarted run loads. Under checkpoint format 2 (`byLineage`) several files can hold
 * one version (attempts with their own unique ids); only the committed lineage counts, walked
 * back from `head` through the lineage in changelog headers.
 */
object CheckpointCleanup {
  private val log = LoggerFactory.getLogger(getClass)
  /** Temporary files of interrupted writes: `.<name>.<uuid>[.TID<n>].tmp`, and their checksums. */
  private val TempFile = """\..+\.tmp(\.crc)?""".r
  /** A temporary file of an interrupted write; none of keyedstate's has a ':', which Hadoop's
   *  Path would read as a URI scheme (another name is not keyedstate's, and stays). */
  private[checkpoint] def tempFile(name: String): Boolean = TempFile.matches(name) && !name.contains(':')
  private val TempChangelog = ("""\.(.+""" + java.util.regex.Pattern.quote(CheckpointLayout.ChangelogSuffix) +
    """)\.[^.]+(?:\.TID\d+)?\.tmp(?:\.crc)?""").r

  /** The temporary file of a changelog above `head`: a commit opens it when its task starts
   *  ([[CheckpointFiles.openOnce]]) and it lives while the task computes, for however long, so
   *  it is no killed write's, whatever its age, until `head` passes it. */
  private def openedAhead(name: String, head: Long): Boolean = name match {
    case TempChangelog(changelog) => CheckpointLayout.versionOf(changelog, CheckpointLayout.ChangelogSuffix).exists(_._1 > head)
    case _ => false
  }
  /** A temporary file this old belongs to a write that was killed (no write of keyedstate's takes
   *  an hour, bar a changelog opened ahead; deleting a live one would only fail that write, and
   *  its task would retry). */
  val TempFileGraceMs: Long = 60L * 60 * 1000

  /** What one cleanup did: files deleted, whether it left nothing for a later cleanup of the
   *  same checkpoint state (no failed delete, no file kept only for its age, every manifest read),
   *  the other partitions' files its kept manifests list (`borrowed`, for the next cleanup; None
   *  while no cleanup had a base), and the oldest snapshot listed past its retention (`nextBase`):
   *  until retention reaches that one, a later cleanup would take the same base and delete nothing. */
  final case class Outcome(deleted: Int, settled: Boolean, borrowed: Option[Set[String]] = None,
      nextBase: Option[Long] = None)

  def run(files: CheckpointFiles, minVersionsToRetain: Int, head: (Long, Option[String]),
      byLineage: Boolean): Outcome = run(files, minVersionsToRetain, head, byLineage, Some(Set.empty[String]))

  /** `borrowedBefore`: the other partitions' files the previous cleanup's kept manifests listed
   *  ([[Outcome]]), None when unknown (a new engine: the manifests this cleanup deletes say); those
   *  no kept manifest lists now are released ([[SharedFiles.release]]). */
  def run(files: CheckpointFiles, minVersionsToRetain: Int, head: (Long, Option[String]),
      byLineage: Boolean, borrowedBefore: Option[Set[String]]): Outcome = {
    val l = files.listing()
    var deleted = 0
    var settled = true
    var failedDelete = false
    def delete(p: org.apache.hadoop.fs.Path): Unit =
      try { files.delete(p); deleted += 1 } catch {
        case NonFatal(e) => settled = false; failedDelete = true; log.warn(s"keyedstate: cannot delete $p", e)
      }
    val killedBefore = System.currentTimeMillis() - TempFileGraceMs
    val temps = l.modified.filter { case (name, _) => tempFile(name) && !openedAhead(name, head._1) }
    temps.foreach { case (name, modified) => if (modified < killedBefore) delete(new org.apache.hadoop.fs.Path(files.dir, name)) }
    // `head` may be a version a task just committed and Spark's commit log does not hold yet: the
    // versions kept are the `minVersionsToRetain` before it too (Spark's HDFS provider counts so).
    val oldestRetained = head._1 - minVersionsToRetain
    val candidates =
      if (byLineage) committedChain(files, l, head, oldestRetained, () => settled = false)
        .filter(e => e._1 <= oldestRetained && l.snapshotFiles.contains(e))
      else l.snapshotFiles.filter(_._1 <= oldestRetained).toSeq.sortBy(-_._1)
    // A temporary file kept for its age, or a snapshot that did not verify (unreadable for now,
    // or broken for good), leaves work for a later cleanup of the same checkpoint state.
    val young = (before: Long) => temps.exists { case (_, modified) => modified >= killedBefore && modified >= before }
    val found = candidates.find { case (v, id) => verified(files, v, id) }
    if (found != candidates.headOption) settled = false
    val nextBase = l.snapshotFiles.map(_._1).filter(_ > oldestRetained).minOption
    val (base, baseId) =
      found.getOrElse(return Outcome(deleted, settled && !young(Long.MinValue), borrowedBefore, nextBase))
    val dropped = l.snapshotFiles.filter { case (v, id) => v < base || (v == base && id != baseId) }
    // A dropped manifest that cannot be read lists nothing here: the lender's cleanup is the backstop.
    val before = borrowedBefore.getOrElse(
      SharedFiles.listedBy(files, dropped, skipUnreadable = true).filter(files.paths.lenderOf(_).isDefined).toSet)
    l.changelogFiles.filter(_._1 <= base).foreach { case (v, id) => delete(files.changelog(v, id)) }
    dropped.foreach { case (v, id) => delete(files.manifest(v, id)) }
    // Anything younger than the base manifest may belong to an upload or a write in progress.
    val horizon = l.modified.getOrElse(files.manifest(base, baseId).getName, 0L)
    var borrowed = before
    val referenced = try {
      val kept = SharedFiles.listedBy(files, l.snapshotFiles.filter(_._1 >= base))
      val borrowedNow = kept.filter(files.paths.lenderOf(_).isDefined).toSet
      // A manifest that failed to go may still list what the kept ones no longer do.
      val released = if (failedDelete) Set.empty[String] else before -- borrowedNow
      val undecided = SharedFiles.release(files, released, delete)
      if (undecided.nonEmpty) settled = false
      borrowed = borrowedNow ++ undecided ++ (if (failedDelete) before else Set.empty)
      Some(files.paths.ownFiles(kept) ++ SharedFiles.lentOut(files, l, delete))
    } catch {
      // The manifests dropped above are gone: the round still ends with an outcome, so that
      // what they listed of other partitions (`borrowed`) reaches the next cleanup.
      case e @ (_: CheckpointFileException | _: IOException) =>
        log.warn(s"keyedstate: cleanup of ${files.dir} keeps every snapshot file: ${e.getMessage}")
        settled = false
        None
    }
    referenced.foreach { kept =>
      val own = try files.snapshotFiles() catch {
        case e: IOException =>
          log.warn(s"keyedstate: cleanup of ${files.dir} cannot list its snapshot files: ${e.getMessage}")
          settled = false
          Map.empty[String, (Long, Long)]
      }
      own.foreach { case (rel, (_, modified)) =>
        if (!kept.contains(rel) && !rel.endsWith(".crc")) {
          if (modified < horizon) delete(files.resolve(rel)) else settled = false
        }
      }
    }
    temps.foreach { case (name, modified) =>
      if (modified >= killedBefore && modified < horizon) delete(new org.apache.hadoop.fs.Path(files.dir, name))
    }
    if (!RetiredPartitions.sweep(files, l, base, horizon, delete)) settled = false
    Outcome(deleted, settled && !young(horizon), Some(borrowed), nextBase)
  }

  /**
   * The committed (version, id) chain from `head` back to the first snapshot at or below
   * `downTo` (or as far as the changelogs go), newest first; `unreadable` is called when a
   * changelog's header cannot be read (the chain then stops short, for now).
   */
  private def committedChain(files: CheckpointFiles, l: Listing, head: (Long, Option[String]),
      downTo: Long, unreadable: () => Unit): Seq[(Long, Option[String])] = {
    var chain = Vector(head)
    var done = false
    while (!done) {
      val (v, id) = chain.last
      if (v <= downTo && l.snapshotFiles.contains((v, id))) done = true
      else if (v <= 1 || !l.changelogFiles.contains((v, id))) done = true
      else {
        val older = try files.readChangelogMeta(v, id).lineage.filter(_._1 < v) catch {
          case _: CheckpointFileException => unreadable(); Nil
        }
        if (older.isEmpty || older.head._1 != v - 1) done = true
        else chain = chain ++ older.map { case (ov, oid) => ov -> Option(oid) }
      }
    }
    chain
  }

  /** Whether every file of the snapshot of `version` is there with its size, and (format 1) the
   *  snapshot is of the attempt its version's changelog holds ([[CheckpointFiles.otherRun]]): a
   *  snapshot of another run's attempt is no base, and the changelog that shows so stays. */
  def verified(files: CheckpointFiles, version: Long, id: Option[String]): Boolean =
    try {
      val m = files.readManifest(version, id)
      val stale = if (id.isEmpty) files.otherRun(version, m.runId) else None
      stale.foreach(why => log.info(s"keyedstate: cleanup of ${files.dir} does not take ${files.manifest(version, id)} " +
        s"as its base: it $why"))
      stale.isEmpty && (m.files ++ m.replay).forall(files.holds)
    } catch { case _: CheckpointFileException => false }
}

/**
 * The cleanups of one store partition by its engine. After one that settled
 * ([[CheckpointCleanup.Outcome]]), the next ones are skipped, without a listing, while the
 * retention, the newest snapshot this engine uploaded and the head's attempt are unchanged and
 * the head has not moved retention past the oldest snapshot that cleanup listed beyond its base:
 * they would take the same base and delete nothing. Files other writers add meanwhile (a stopped
 * run's last upload, a killed write's temp file) wait for the cleanup after the base moves, or
 * the next run's first cleanup.
 */
final class StoreCleanup(files: CheckpointFiles) {
  private final case class Settled(retain: Int, head: (Long, Option[String]), newestSnapshot: Long,
      byLineage: Boolean, nextBase: Option[Long]) {
    def covers(r: Int, h: (Long, Option[String]), snapshot: Long, lineage: Boolean): Boolean =
      r == retain && snapshot == newestSnapshot && lineage == byLineage &&
        (h == head || h._1 > head._1) && nextBase.forall(h._1 - r < _)
  }
  @volatile private var settledAt: Option[Settled] = None
  /** The other partitions' files the last cleanup's kept manifests listed ([[SharedFiles.release]]);
   *  unknown until a cleanup had a base. */
  @volatile private var borrowed: Option[Set[String]] = None

  /** Cleanup counting back from the committed version `head` (its unique id `headId` under format
   *  2); the number of files deleted (0 when skipped). */
  def run(minVersionsToRetain: Int, head: Long, headId: Option[String], newestSnapshot: Long, byLineage: Boolean): Int = {
    if (settledAt.exists(_.covers(minVersionsToRetain, head -> headId, newestSnapshot, byLineage))) return 0
    settledAt = None
    val outcome = CheckpointCleanup.run(files, minVersionsToRetain, head -> headId, byLineage, borrowed)
    borrowed = outcome.borrowed
    if (outcome.settled) {
      settledAt = Some(Settled(minVersionsToRetain, head -> headId, newestSnapshot, byLineage, outcome.nextBase))
    }
    outcome.deleted
  }
}
