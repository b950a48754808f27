package io.keyedstate.checkpoint

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path
import org.slf4j.LoggerFactory

import io.keyedstate.format.CheckpointLayout

/**
 * Partitions a scale-down retired (FORMATS.md, "Partitions a scale-down retires"): no engine runs
 * in them again, so the partition holding the marker `ks-retired-<q>-<v>` deletes what `q` holds
 * once its own cleanup's base is at or past `v`, when no retained version of the store reads
 * from before the scale-down. Files `q` lent and a live partition still lists stay, as
 * [[SharedFiles]] keeps them; the marker goes once `q` holds none of keyedstate's files.
 */
object RetiredPartitions {
  private val log = LoggerFactory.getLogger(getClass)

  /** Retires every partition `files`' markers name at a version at or below `base`, deleting
   *  only files modified before `horizon`; whether none is left for a later cleanup. */
  def sweep(files: CheckpointFiles, l: Listing, base: Long, horizon: Long, delete: Path => Unit): Boolean =
    files.paths.retired(l.modified.keys).distinct.map { case (q, since) =>
      since > base || files.paths.partition.contains(q) || {
        try {
          val done = retire(files.sibling(q), since, horizon, delete, Set(q))
          if (done) files.paths.retiredMarkers(l.modified.keys, q, since).foreach(delete)
          done
        } catch {
          // Any error (a storage error, an unreadable manifest, a name a Path refuses) keeps q for
          // a later round; it never ends the holder's cleanup without its outcome.
          case NonFatal(e) =>
            log.warn(s"keyedstate: cleanup of ${files.dir} keeps partition $q, which a scale-down retired, " +
              s"for now: ${e.getMessage}")
            false
        }
      }
    }.forall(identity)

  /** Deletes what the retired `q` holds; whether nothing of keyedstate's is left there. A partition
   *  holding a version at or past `since` is live again (a later rescale recreated it, or the
   *  scale-down was rolled back): nothing of it goes. `seen`: the partitions retired on this path
   *  (a retired partition's own markers name partitions an earlier scale-down retired); a marker
   *  past `since`, which no scale-down writes, is deleted unfollowed. */
  private def retire(q: CheckpointFiles, since: Long, horizon: Long, delete: Path => Unit, seen: Set[Int]): Boolean = {
    val l = q.listing()
    if ((l.changelogFiles ++ l.snapshotFiles).exists(_._1 >= since)) {
      log.info(s"keyedstate: ${q.dir}, which a scale-down at version $since retired, holds versions at or past it: " +
        "it is live again, and keeps its files")
      return true
    }
    // Followed only at or below `since` (q was live when a later scale-down wrote one; a live
    // partition holds versions past it, so the check above keeps it whatever a marker names).
    val older = q.paths.retired(l.modified.keys).distinct.map { case (p, v) =>
      val done = v > since || seen.contains(p) || retire(q.sibling(p), v, horizon, delete, seen + p)
      if (done) q.paths.retiredMarkers(l.modified.keys, p, v).foreach(delete)
      done
    }.forall(identity)
    val released = SharedFiles.listedBy(q, l.snapshotFiles, skipUnreadable = true).filter(q.paths.lenderOf(_).isDefined).toSet
    l.changelogFiles.foreach { case (v, id) => delete(q.changelog(v, id)) }
    l.snapshotFiles.foreach { case (v, id) => delete(q.manifest(v, id)) }
    l.modified.keys.filter(CheckpointCleanup.tempFile).foreach(name => delete(new Path(q.dir, name)))
    val undecided = SharedFiles.release(q, released, delete)
    val lent = SharedFiles.lentOut(q, l, delete)
    q.snapshotFiles().foreach { case (rel, (_, modified)) =>
      if (!lent.contains(CheckpointFiles.checksummed(rel)) && modified < horizon) delete(q.snapshotFile(rel))
    }
    val after = q.listing()
    val emptied = older && undecided.isEmpty && after.changelogFiles.isEmpty && after.snapshotFiles.isEmpty &&
      !after.modified.keys.exists(n => CheckpointCleanup.tempFile(n) || CheckpointLayout.BorrowerMarker.matches(n) ||
        CheckpointLayout.RetiredMarker.matches(n)) &&
      q.snapshotFiles().isEmpty
    if (emptied) log.info(s"keyedstate: cleanup emptied ${q.dir}, which a scale-down at version $since retired")
    emptied
  }
}
