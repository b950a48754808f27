package io.keyedstate.checkpoint

import scala.collection.immutable.SortedSet

import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, CheckpointLayout, CorruptChangelogException,
  CorruptManifestException, ManifestFormat, SnapshotFile, SnapshotManifest, UnsafePathException}

/** A store partition's files: (version, unique id) of every changelog and snapshot manifest. */
final case class Listing(changelogFiles: Set[(Long, Option[String])], snapshotFiles: Set[(Long, Option[String])],
    foreign: Seq[String], modified: Map[String, Long]) {
  def changelogs: SortedSet[Long] = SortedSet(changelogFiles.map(_._1).toSeq: _*)
  def snapshots: SortedSet[Long] = SortedSet(snapshotFiles.map(_._1).toSeq: _*)
  def latest: Option[Long] = (changelogs ++ snapshots).lastOption
}
