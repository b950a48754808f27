package io.keyedstate.checkpoint

import java.io.IOException

import org.apache.hadoop.fs.Path
import org.slf4j.LoggerFactory

/**
 * Snapshot files a rescale by files shares (FORMATS.md, "Rescale by files"): a file in a lender's
 * `ks-files/` stays while a manifest of the lender or of a borrower (a partition the lender holds
 * a marker of) lists it, and whoever drops the last listing deletes it, as Flink's shared state
 * registry counts references: the lender's cleanup for its own files ([[CheckpointCleanup]]), a
 * borrower's cleanup for the lender's files its manifests stopped listing ([[release]]). Either
 * drops its listing before it looks at the other's, so the later of two concurrent drops sees both.
 */
object SharedFiles {
  private val log = LoggerFactory.getLogger(getClass)

  /**
   * The files of `lender` (as its listing names them) that any manifest of a borrower lists. A
   * marker whose borrower lists none goes when `dropMarker` says so; a borrower's manifest that
   * cannot be read throws [[CheckpointFileException]], a listing the storage fails IOException.
   */
  def lentOut(lender: CheckpointFiles, l: Listing, dropMarker: Path => Unit): Set[String] =
    lender.paths.borrowers(l.modified.keys).flatMap { q =>
      val borrower = lender.sibling(q)
      val mine = lender.paths.ownFiles(listedBy(borrower, borrower.listing().snapshotFiles), othersOnly = true)
      if (mine.isEmpty) dropMarker(lender.paths.borrowerMarker(q))
      mine
    }.toSet

  /**
   * Every path the given manifests of a partition list (files and changelogs to replay). One that
   * cannot be read throws [[CheckpointFileException]], or lists nothing when `skipUnreadable`.
   */
  def listedBy(files: CheckpointFiles, manifests: Iterable[(Long, Option[String])],
      skipUnreadable: Boolean = false): Seq[String] =
    manifests.toSeq.flatMap { case (v, id) =>
      try { val m = files.readManifest(v, id); (m.files ++ m.replay).map(_.path) }
      catch { case _: CheckpointFileException if skipUnreadable => Nil }
    }

  /**
   * Deletes, of `released` (paths the manifests of `borrower` listed in other partitions and list
   * no more), those that no manifest of their lender nor of its borrowers lists; and the
   * borrower's marker in a lender it lists nothing of now, by [[lentOut]]'s rule on the
   * borrower's manifests read here (a manifest that failed to go, or one written since this
   * cleanup listed, keeps it). Returns the released paths of lenders that could not be read or
   * listed (a corrupt manifest, a storage error): a later cleanup decides on them.
   */
  def release(borrower: CheckpointFiles, released: Set[String], delete: Path => Unit): Set[String] =
    released.groupBy(path => borrower.paths.lenderOf(path).get).flatMap { case (p, paths) =>
      try {
        val lender = borrower.sibling(p)
        val l = lender.listing()
        val marker = borrower.paths.partition.map(lender.paths.borrowerMarker)
        val listed = lender.paths.ownFiles(listedBy(lender, l.snapshotFiles)) ++
          lentOut(lender, l, m => if (marker.contains(m)) delete(m))
        lender.paths.ownFiles(paths, othersOnly = true).foreach { rel =>
          if (!listed.contains(rel)) delete(lender.resolve(rel))
        }
        Set.empty[String]
      } catch {
        case e @ (_: CheckpointFileException | _: IOException) =>
          log.warn(s"keyedstate: cleanup of ${borrower.dir} keeps the files of partition $p it no longer lists, " +
            s"for now: ${e.getMessage}")
          paths
      }
    }.toSet
}
