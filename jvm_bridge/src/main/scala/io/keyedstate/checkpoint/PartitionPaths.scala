package io.keyedstate.checkpoint

import org.apache.hadoop.fs.Path

import io.keyedstate.format.CheckpointLayout

/**
 * Where a store partition's files are, and those of the same store's other partitions, which a
 * rescale's heirs share (FORMATS.md, "The path rule" and "Rescale by files"): a store partition is
 * `<operator>/<partition>` for the store `default`, `<operator>/<partition>/<store>` otherwise.
 */
final class PartitionPaths(dir: Path, defaultStore: Boolean) {
  private val partitionDir: Path = if (defaultStore) dir else dir.getParent
  private val filesDir = new Path(dir, CheckpointLayout.FilesDir)

  /** This store partition's number (its directory's name). */
  val partition: Option[Int] = partitionDir.getName.toIntOption

  /** The same store's partition `p` of this operator. */
  def storeDirOf(p: Int): Path = {
    val other = new Path(partitionDir.getParent, p.toString)
    if (defaultStore) other else new Path(other, dir.getName)
  }

  /** A path a manifest lists (checked by [[CheckpointLayout.checkedRelativePath]] when read): in
   *  this partition's `ks-files/`, or in another partition's of the same operator and store. */
  def resolve(relative: String): Path = CheckpointLayout.ownerOf(relative) match {
    case (Some(p), name) if !partition.contains(p) => new Path(new Path(storeDirOf(p), CheckpointLayout.FilesDir), name)
    case (_, name) => new Path(filesDir, name)
  }

  /** Of the paths manifests list, those of files in this partition's `ks-files/`, as its listing
   *  names them (`ks-files/<name>`); `othersOnly`: only those another partition lists by owner. */
  def ownFiles(paths: Iterable[String], othersOnly: Boolean = false): Set[String] =
    paths.flatMap { path =>
      val (owner, name) = CheckpointLayout.ownerOf(path)
      val own = if (othersOnly) owner.exists(partition.contains) else owner.forall(partition.contains)
      if (own) Some(s"${CheckpointLayout.FilesDir}/$name") else None
    }.toSet

  /** The partition whose files a manifest path names, when another than this one (a lender). */
  def lenderOf(path: String): Option[Int] = CheckpointLayout.ownerOf(path)._1.filterNot(partition.contains)

  /** The partitions that list files of this one (rescale heirs), by the markers in `names`. */
  def borrowers(names: Iterable[String]): Seq[Int] =
    names.toSeq.collect { case CheckpointLayout.BorrowerMarker(q) if q.toIntOption.isDefined => q.toInt }.sorted

  def borrowerMarker(q: Int): Path = new Path(dir, s"ks-borrower-$q")

  /** The partitions a scale-down retired (with the version it retired them at) whose files this
   *  one deletes once its retention passes that version, by the markers in `names`. */
  def retired(names: Iterable[String]): Seq[(Int, Long)] =
    names.toSeq.collect {
      case CheckpointLayout.RetiredMarker(q, v) if q.toIntOption.isDefined && v.toLongOption.isDefined => (q.toInt, v.toLong)
    }.sorted

  def retiredMarker(q: Int, version: Long): Path = new Path(dir, s"ks-retired-$q-$version")

  /** The marker files among `names` that [[retired]] reads as (`q`, `version`), by their own
   *  names (`ks-retired-05-7` too, which no rescale writes but which reads so). */
  def retiredMarkers(names: Iterable[String], q: Int, version: Long): Seq[Path] =
    names.toSeq.collect {
      case name @ CheckpointLayout.RetiredMarker(p, v) if p.toIntOption.contains(q) && v.toLongOption.contains(version) =>
        new Path(dir, name)
    }
}
