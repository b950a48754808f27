package io.keyedstate.engine

import java.nio.file.{Files, Path}
import java.util.UUID
import java.util.concurrent.atomic.AtomicLong

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.slf4j.LoggerFactory

import io.keyedstate.bridge.{LocalFiles, ServerLaunch, StateServerDiedException}
import io.keyedstate.checkpoint.{CheckpointFileException, CheckpointFiles, Listing, LocalDisk, LocalDiskException}
import io.keyedstate.format.{CheckpointLayout, SnapshotFile}

/**
 * Brings the state server's store to a version from the checkpoint: the newest snapshot at or
 * below it (its files downloaded into a private local directory, then installed by the server),
 * then the changelogs after it, replayed in order. Any executor can load any version this way.
 *
 * Like Spark's auto snapshot repair, a snapshot that cannot be used (a file missing or of the
 * wrong size, a corrupt, foreign or tampered manifest, a database RocksDB refuses) is skipped in
 * favour of an older one plus the changelogs after it, with a warning naming it (so is, under
 * checkpoint format 1, a snapshot of another run's attempt of its version); when no
 * snapshot and changelogs rebuild the version, the task fails naming what is missing. A failing
 * local disk is reported as such, never as a checkpoint problem.
 */
final class VersionLoader(files: CheckpointFiles, uploader: SnapshotUploader, describe: String) {
  import VersionLoader._

  /** Snapshots skipped because they could not be used (a custom metric). */
  val snapshotsSkipped = new AtomicLong

  /**
   * Loads `version` (under checkpoint format 2: the one written with unique id `id`) into the
   * session's store. Returns the exact key count and the versions loaded, newest first, down to
   * the snapshot it started from (with their unique ids): the lineage of what the store holds.
   */
  def load(session: ServerSession, version: Long, id: Option[String], keyGroups: Int,
      workDir: Path): (Long, List[(Long, Option[String])]) = {
    val listing = files.listing()
    var problems = List.empty[String]
    for (plan <- plans(listing, version, id)) plan match {
      case Left(problem) => problems ::= problem
      case Right(chain) =>
        val base = chain.last
        val localRoot = try LocalFiles.createPrivateDirectories(workDir.resolve("restore").resolve(UUID.randomUUID().toString))
          catch { case e: java.io.IOException => throw LocalDisk.failed(workDir.resolve("restore"), e) }
        try {
          if (base._1 == 0) restoreEmpty(session, 0)
          else restoreSnapshot(session, base, keyGroups, localRoot)
          replayChangelogs(session, chain.init.reverse, localRoot)
          val numKeys = Json.readTree(session.control("reading store info")((api, h) => api.storeInfo(h))).get("numKeys").asLong()
          return (numKeys, chain)
        } catch {
          case e @ (_: LocalDiskException | _: StateServerDiedException) => throw e
          case e: SnapshotUnusable if base._1 > 0 =>
            snapshotsSkipped.incrementAndGet()
            log.warn(s"keyedstate: skipping the snapshot of version ${base._1} of $describe: ${e.getMessage}; " +
              "loading an older snapshot and the changelogs after it")
            problems ::= e.getMessage
        } finally LocalFiles.deleteTree(localRoot)
    }
    throw new CheckpointFileException(s"keyedstate: cannot load version $version of $describe: " +
      s"${problems.reverse.mkString("; ")}.${foreign(listing)}")
  }

  /**
   * The ways to rebuild a version, best first, each the chain of (version, id) from it down to a
   * snapshot (or to 0: empty), or why a way does not exist: FORMATS.md "Loading a version", held
   * with Python's `checkpoint/plans.py` to the golden cases. Format 1: every format-1 snapshot at
   * or below the version, then none, then a changelog written from empty. Format 2: the version's
   * own lineage, read from the changelogs' headers as far back as needed, with the snapshots
   * written under those very ids.
   */
  private def plans(listing: Listing, version: Long, id: Option[String]): Iterator[Either[String, List[(Long, Option[String])]]] =
    if (id.isEmpty) {
      val bases = listing.snapshotFiles.collect { case (v, None) if v <= version => v }.toSeq.sorted.reverse :+ 0L
      def missing(base: Long) = (base + 1 to version).filterNot(v => listing.changelogFiles.contains((v, None)))
      val usable = bases.filter(missing(_).isEmpty).map(base => Right((version to base by -1).map(_ -> Option.empty[String]).toList))
      val gap = missing(bases.head)
      usable.iterator ++ fromEmpty(listing, version).iterator ++ Iterator(Left(
        if (gap.isEmpty) "no usable snapshot"
        else s"missing ${gap.take(3).map(files.changelog(_)).mkString(", ")}${if (gap.size > 3) " ..." else ""}"))
    } else new Iterator[Either[String, List[(Long, Option[String])]]] {
      // The chain grows backwards from the version through the lineage in changelog headers.
      private var chain = Vector(version -> id)
      private var pending: Option[Either[String, List[(Long, Option[String])]]] = None
      private var exhausted = false
      private var checked = 0
      override def hasNext: Boolean = { advance(); pending.isDefined }
      override def next(): Either[String, List[(Long, Option[String])]] = { advance(); val n = pending.get; pending = None; n }
      private def end(plan: Either[String, List[(Long, Option[String])]]): Unit = { pending = Some(plan); exhausted = true }
      private def advance(): Unit = while (pending.isEmpty && !exhausted) {
        if (checked < chain.size) {
          checked += 1
          if (listing.snapshotFiles.contains(chain(checked - 1))) pending = Some(Right(chain.take(checked).toList))
        } else {
          val (oldest, oldestId) = chain.last
          if (oldest == 0) end(Right(chain.toList))
          else if (!listing.changelogFiles.contains((oldest, oldestId))) end(Left(s"missing ${files.changelog(oldest, oldestId)}"))
          else if (oldest == 1) chain :+= (0L -> None)
          else try {
            val meta = files.readChangelogMeta(oldest, oldestId)
            if (meta.fromEmpty) chain :+= (0L -> None) // a base: nothing older is needed
            else {
              val source = files.changelog(oldest, oldestId).toString
              olderLineage(meta.lineage, oldest, source) match {
                case Left(why) => end(Left(why))
                case Right(older) =>
                  // The last entry is checked when the chain reaches it; every other must be listed.
                  older.init.find(e => !listing.snapshotFiles.contains(e) && !listing.changelogFiles.contains(e)) match {
                    case Some((v, vid)) => end(Left(s"$source records version $v with id ${vid.get} in its lineage, " +
                      s"and ${files.changelog(v, vid)} is missing"))
                    case None => chain ++= older
                  }
              }
            }
          } catch { case e: CheckpointFileException => end(Left(e.getMessage)) }
        }
      }
    }

  /**
   * The (version, id) pairs below `version` in the lineage of changelog `source`'s header:
   * consecutive from `version - 1` down, each id a UUID (an id becomes part of a file name).
   */
  private def olderLineage(lineage: Seq[(Long, String)], version: Long, source: String): Either[String, List[(Long, Option[String])]] = {
    val older = lineage.filter(_._1 < version).toList
    if (older.nonEmpty && older.head._1 == version - 1 && older.zip(older.tail).forall { case (a, b) => b._1 == a._1 - 1 } &&
        older.forall { case (_, u) => u != null && CheckpointLayout.UniqueId.matches(u) }) Right(older.map { case (v, u) => v -> Some(u) })
    else Left(s"$source records the lineage ${lineage.map { case (v, u) => s"[$v, $u]" }.mkString("[", ", ", "]")}, which is not " +
      s"the versions before $version with their unique ids: the changelog is corrupt or was tampered with")
  }

  /**
   * Format 1's last way: the changelogs back from `version` to one written from empty by an
   * offline writer (its snapshot missing, say, after a failed upload), which needs nothing older.
   * Their headers are read only here, once every snapshot-based way has failed.
   */
  private def fromEmpty(listing: Listing, version: Long): Option[Either[String, List[(Long, Option[String])]]] = {
    var v = version
    while (v >= 1 && listing.changelogFiles.contains((v, None))) {
      val meta = try files.readChangelogMeta(v, None) catch { case e: CheckpointFileException => return Some(Left(e.getMessage)) }
      if (meta.fromEmpty) return Some(Right(((version to v by -1).map(_ -> Option.empty[String]) :+ (0L -> None)).toList))
      v -= 1
    }
    None
  }

  private def foreign(listing: Listing): String =
    if (listing.foreign.isEmpty) ""
    else s" The directory holds files of another state store provider (${listing.foreign.take(5).mkString(", ")}): " +
      "this checkpoint was not written by keyedstate; restart the query with the provider that wrote it."

  /** Makes the store hold an empty `version` (Spark loads version 0 empty, or asks for `loadEmpty`). */
  def restoreEmpty(session: ServerSession, version: Long): Unit = {
    val lineage = uploader.newLineage(Nil)
    session.control(s"loading version $version of $describe")((api, h) => api.restore(h, version, null, lineage, 0))
  }

  private def restoreSnapshot(session: ServerSession, base: (Long, Option[String]), keyGroups: Int, localRoot: Path): Unit = {
    val s = base._1
    val source = files.manifest(s, base._2).toString
    val manifest = try files.readManifest(s, base._2) catch { case e: CheckpointFileException => throw new SnapshotUnusable(e.getMessage) }
    if (base._2.isEmpty) files.otherRun(s, manifest.runId).foreach(why => throw new SnapshotUnusable(s"$source $why"))
    if (manifest.keyGroups != keyGroups) {
      throw new CheckpointFileException(
        s"keyedstate: $source was written with keyGroups=${manifest.keyGroups} but this query sets " +
          s"${ServerLaunch.ConfPrefix}keyGroups=$keyGroups; the key-group count is fixed for a checkpoint")
    }
    val snapDir = Files.createDirectories(localRoot.resolve("snapshot"))
    manifest.files.foreach(f => download(f, snapDir, source))
    val lineage = uploader.newLineage(manifest.files)
    def installed[T](f: => T): T =
      try f catch {
        case e: StateServerDiedException => throw e
        case NonFatal(e) if Option(e.getMessage).exists(_.contains("local disk is full")) => throw e
        case NonFatal(e) => throw new SnapshotUnusable(s"the state server could not open $source: ${e.getMessage}")
      }
    manifest.replay match {
      case None =>
        installed(session.control(s"restoring snapshot $source")((api, h) => api.restore(h, s, snapDir.toString, lineage, manifest.numKeys)))
      case Some(r) => // the files as version s - 1, then the version itself as a changelog
        val dir = if (manifest.files.isEmpty) null else snapDir.toString
        installed(session.control(s"restoring snapshot $source")((api, h) => api.restore(h, s - 1, dir, lineage, 0)))
        val local = download(r, localRoot, source)
        installed(replay(session, Seq((s, local, files.resolve(r.path).toString)), s"replaying ${files.resolve(r.path)}"))
        Files.deleteIfExists(local)
    }
  }

  /** Replays changelogs (oldest first) in groups, so that local disk holds a bounded number of copies. */
  private def replayChangelogs(session: ServerSession, versions: Seq[(Long, Option[String])], localRoot: Path): Unit =
    versions.grouped(ReplayGroup).foreach { group =>
      val locals = group.map { case (v, id) =>
        val local = localRoot.resolve(s"$v.ks-changelog")
        val meta = files.downloadChangelog(v, id, local)
        (v, local, files.changelog(v, id).toString, meta.fromEmpty)
      }
      // A version written from empty (an offline writer's) is no delta: the replay starts over there.
      val from = locals.lastIndexWhere(_._4)
      if (from >= 0) restoreEmpty(session, locals(from)._1 - 1)
      val replayed = locals.drop(math.max(from, 0))
      replay(session, replayed.map(l => (l._1, l._2, l._3)), s"replaying changelogs ${replayed.head._1}..${replayed.last._1} of $describe")
      locals.foreach { l => Files.deleteIfExists(l._2) }
    }

  /** Downloads a snapshot file (name and path were checked when the manifest was read) and
   *  checks its size against the manifest. */
  private def download(f: SnapshotFile, dir: Path, manifest: String): Path = {
    val local = dir.resolve(f.name)
    val path = try files.resolve(f.path) catch {
      case e: CheckpointFileException => throw new SnapshotUnusable(s"$manifest lists ${f.path}: ${e.getMessage}")
    }
    try if (CheckpointLayout.isTableFile(f.name)) files.downloadUnchanging(path, local) else files.download(path, local) catch {
      case e: CheckpointFileException => throw new SnapshotUnusable(s"$manifest lists $path: ${e.getMessage}")
    }
    val size = Files.size(local)
    if (size != f.size) {
      throw new SnapshotUnusable(s"$path has $size bytes but snapshot manifest $manifest says " +
        s"${f.size}: truncated or corrupt")
    }
    local
  }

  private def replay(session: ServerSession, logs: Seq[(Long, Path, String)], what: String): Unit = {
    val json = Json.writeValueAsString(logs.map { case (v, local, origin) =>
      java.util.List.of(Long.box(v), local.toString, origin)
    }.asJava)
    session.control(what)((api, h) => api.replay(h, json))
  }
}

object VersionLoader {
  private val log = LoggerFactory.getLogger(classOf[VersionLoader])
  private val Json = new ObjectMapper()
  private val ReplayGroup = 32
}
