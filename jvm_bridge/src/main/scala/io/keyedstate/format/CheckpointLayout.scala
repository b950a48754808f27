package io.keyedstate.format

import scala.util.matching.Regex

/**
 * The layout of one store partition's checkpoint directory (spec: FORMATS.md, "Checkpoint
 * layout"; the Python twin is `keyedstate/formats/layout.py`):
 *
 *   <v>[_<id>].ks-changelog  the writes of version v (the commit record; [[ChangelogFormat]])
 *   <v>[_<id>].ks-snapshot   the manifest of a snapshot of version v ([[ManifestFormat]])
 *   ks-files/<id>-<name>     snapshot files, immutable, shared by every manifest that lists them
 *
 * `_<id>`: the version's unique id under checkpoint format version 2 (Spark's
 * `checkpointFormatVersion=2`), so that attempts of one version never share a file name.
 *
 * A tampered manifest could name anything: every name or path read from a checkpoint file goes
 * through [[checkedFileName]] / [[checkedRelativePath]] before it is joined to a directory.
 */
object CheckpointLayout {
  val ChangelogSuffix = ".ks-changelog"
  val ManifestSuffix = ".ks-snapshot"
  val FilesDir = "ks-files"

  /** Files of Spark's HDFS-backed and RocksDB providers: a directory holding them is not ours. */
  val ForeignFile: Regex = """\d+(?:_[0-9a-fA-F-]+)?\.(?:delta|snapshot|zip|changelog)""".r

  /** A snapshot file's local name: what RocksDB puts in a checkpoint, a rescale's replay log, or
   *  the snapshot's key-group counts (read by the state server only). */
  val FileName: Regex =
    ("""(?:\d{1,20}\.(?:sst|log|blob)|(?:MANIFEST|OPTIONS)-\d{1,20}|CURRENT|IDENTITY|rocksdict-config\.json""" +
      """|replay-\d{1,20}\.ks-changelog|ks-key-group-counts)""").r

  /** A RocksDB table file among a snapshot's: immutable once written (RocksDB only reads it and
   *  deletes its own name for it), so an upload may reuse it and a local restore may link it. */
  def isTableFile(name: String): Boolean = name.endsWith(".sst")

  /** Where a manifest may say a snapshot file lives: directly inside `ks-files/` of its own store
   *  partition, or (`../<p>/ks-files/<name>`) of partition `<p>` of the same operator and store,
   *  whose files a rescale shares with the partitions it split the state into. */
  val RelativePath: Regex = ("""(?:\.\./(\d{1,10})/)?""" + FilesDir + """/([A-Za-z0-9][A-Za-z0-9._-]{0,254})""").r

  /** A file in a store partition whose snapshot files partition `<q>` of the same operator and
   *  store lists (a rescale's heir): cleanup keeps what that partition's manifests still list. */
  val BorrowerMarker: Regex = """ks-borrower-(\d{1,10})""".r

  /** A file in a store partition naming partition `<q>` of the same operator and store, which a
   *  scale-down retired at version `<v>` (the new partitions' first): once this partition retains
   *  no version below `<v>`, its cleanup deletes what `<q>` holds. */
  val RetiredMarker: Regex = """ks-retired-(\d{1,10})-(\d{1,19})""".r

  def checkedFileName(name: String, source: String): String =
    if (name != null && FileName.matches(name)) name
    else throw new UnsafePathException(s"$source names the snapshot file '$name', which is not a RocksDB or " +
      "keyedstate file name: the manifest is corrupt or was tampered with")

  def checkedRelativePath(path: String, source: String): String = path match {
    case RelativePath(owner, name) if !name.contains("..") && (owner == null || owner.toIntOption.isDefined) => path
    case _ => throw new UnsafePathException(s"$source lists the path '$path', which is not a file directly inside " +
      s"$FilesDir/ of a partition of its store: the manifest is corrupt or was tampered with")
  }

  /** (the partition whose `ks-files/` holds it, None for the manifest's own; its name there) of a
   *  path [[checkedRelativePath]] accepted. */
  def ownerOf(path: String): (Option[Int], String) = path match {
    case RelativePath(owner, name) => (Option(owner).map(_.toInt), name)
    case _ => throw new UnsafePathException(s"'$path' is not a snapshot file path")
  }

  /** A version's unique id (checkpoint format 2): a UUID. */
  val UniqueId: Regex = """[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}""".r
  private val VersionName: Regex = ("""(\d{1,19})(?:_(""" + UniqueId.regex + """))?""").r

  def changelogName(version: Long, id: Option[String] = None): String = name(version, id) + ChangelogSuffix
  def manifestName(version: Long, id: Option[String] = None): String = name(version, id) + ManifestSuffix

  private def name(version: Long, id: Option[String]): String = id match {
    case Some(u) if UniqueId.matches(u) => s"${version}_$u"
    case Some(u) => throw new UnsafePathException(s"'$u' is not a unique id of a state store version")
    case None => version.toString
  }

  /** The version (and unique id) in `<v>[_<id>]<suffix>`, or None for any other name. */
  def versionOf(name: String, suffix: String): Option[(Long, Option[String])] =
    if (!name.endsWith(suffix)) None
    else name.stripSuffix(suffix) match {
      case VersionName(v, id) => v.toLongOption.map(_ -> Option(id))
      case _ => None
    }

  /**
   * Reads the JSON of keyedstate's files (a manifest, a changelog's metadata) as Python's
   * `json.loads` (`formats/layout.py` `json_of`) does: anything after the value but whitespace is
   * refused, and so (Jackson's default) are NaN and Infinity.
   */
  val JsonReader: com.fasterxml.jackson.databind.ObjectMapper = new com.fasterxml.jackson.databind.ObjectMapper()
    .enable(com.fasterxml.jackson.databind.DeserializationFeature.FAIL_ON_TRAILING_TOKENS)

  /**
   * Text of a checkpoint file (a manifest, a changelog's metadata, Spark's metadata), which must
   * be UTF-8: a malformed byte is refused, not replaced (FORMATS.md, "Text and metadata"; Python's
   * strict `bytes.decode("utf-8")` is the twin), so both languages read or refuse the same files.
   */
  def utf8(data: Array[Byte], offset: Int, length: Int): String =
    try java.nio.charset.StandardCharsets.UTF_8.newDecoder()
      .onMalformedInput(java.nio.charset.CodingErrorAction.REPORT)
      .onUnmappableCharacter(java.nio.charset.CodingErrorAction.REPORT)
      .decode(java.nio.ByteBuffer.wrap(data, offset, length)).toString
    catch {
      case e: java.nio.charset.CharacterCodingException =>
        throw new IllegalArgumentException(s"not UTF-8 text (${e.getClass.getSimpleName})", e)
    }
}
