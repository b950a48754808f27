package io.keyedstate.format

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}

/**
 * The snapshot manifest (spec: FORMATS.md, "Snapshot manifest"; the Python twin is
 * `keyedstate/formats/manifest.py`): compact UTF-8 JSON, keys in this order:
 *
 *   {"format":"keyedstate-snapshot","formatVersion":1,"version":v,"keyGroups":n,"numKeys":n,
 *    "files":[{"name":..,"path":..,"size":..},..],["replay":{..},]["keyLayout":{..},]["ttl":{..},]["rescale":{..},]
 *    ["runId":".."]}
 *
 * Names and paths are checked with [[CheckpointLayout]]'s rule when a manifest is read.
 */
object ManifestFormat {
  val Format = "keyedstate-snapshot"
  val FormatVersion = 1
  private val Json = new ObjectMapper()

  def encode(m: SnapshotManifest): Array[Byte] = {
    val tree = new java.util.LinkedHashMap[String, AnyRef]()
    tree.put("format", Format)
    tree.put("formatVersion", Int.box(FormatVersion))
    tree.put("version", Long.box(m.version))
    tree.put("keyGroups", Int.box(m.keyGroups))
    tree.put("numKeys", Long.box(m.numKeys))
    tree.put("files", m.files.map(file).asJava)
    m.replay.foreach(r => tree.put("replay", file(r)))
    m.keyLayout.foreach(l => tree.put("keyLayout", keyLayoutTree(l)))
    m.ttl.foreach(t => tree.put("ttl", t))
    m.rescale.foreach(r => tree.put("rescale", r))
    m.runId.foreach(r => tree.put("runId", r))
    Json.writeValueAsBytes(tree)
  }

  private[format] def keyLayoutTree(l: KeyLayout): java.util.Map[String, AnyRef] = {
    val layout = new java.util.LinkedHashMap[String, AnyRef]()
    layout.put("keyColumns", Int.box(l.keyColumns))
    layout.put("partitionKeyColumns", Int.box(l.partitionKeyColumns))
    layout.put("prefixColumns", Int.box(l.prefixColumns))
    layout
  }

  /** A recorded key layout: an object of three non-negative integers, at most `keyColumns` hashed
   *  or prefix columns; anything else (`null` included) is refused (FORMATS.md, "Stored keys and
   *  values"; Python's twin: `KeyLayout.from_json`). */
  private[format] def keyLayoutOf(l: JsonNode): KeyLayout = {
    if (!l.isObject) throw new IllegalArgumentException(s"field 'keyLayout' is $l, expected an object")
    val layout = KeyLayout(int(l, "keyColumns"), int(l, "partitionKeyColumns"), int(l, "prefixColumns"))
    if (layout.partitionKeyColumns > layout.keyColumns || layout.prefixColumns > layout.keyColumns) {
      throw new IllegalArgumentException(s"field 'keyLayout' is $l: more hashed or prefix columns than key columns")
    }
    layout
  }

  private def int(node: JsonNode, field: String): Int = {
    val v = long(node, field)
    if (v > Int.MaxValue) throw new IllegalArgumentException(s"field '$field' is $v, expected at most ${Int.MaxValue}")
    v.toInt
  }

  private def file(f: SnapshotFile): java.util.Map[String, AnyRef] = {
    val out = new java.util.LinkedHashMap[String, AnyRef]()
    out.put("name", f.name)
    out.put("path", f.path)
    out.put("size", Long.box(f.size))
    out
  }

  /** Parses and checks a manifest (of `version`, if >= 0); `source` names it in errors. */
  def decode(data: Array[Byte], source: String, version: Long = -1): SnapshotManifest =
    try {
      val node = CheckpointLayout.JsonReader.readTree(CheckpointLayout.utf8(data, 0, data.length))
      if (node == null || !node.isObject || node.path("format").asText() != Format) {
        throw new IllegalArgumentException("not a keyedstate snapshot manifest")
      }
      val formatVersion = node.path("formatVersion").asInt(-1)
      if (formatVersion != FormatVersion) {
        throw new IllegalArgumentException(s"manifest format version $formatVersion, this keyedstate reads $FormatVersion")
      }
      val found = long(node, "version")
      if (version >= 0 && found != version) throw new IllegalArgumentException(s"it describes version $found")
      val files = node.get("files")
      if (files == null || !files.isArray) throw new IllegalArgumentException("field 'files' is not a list")
      val keyLayout = Option(node.get("keyLayout")).map(keyLayoutOf)
      val ttl = Option(node.get("ttl")).filterNot(_.isNull).map { t =>
        if (!t.isObject) throw new IllegalArgumentException("field 'ttl' is not an object")
        Json.convertValue(t, classOf[java.util.LinkedHashMap[String, AnyRef]]): java.util.Map[String, AnyRef]
      }
      val runId = Option(node.get("runId")).filterNot(_.isNull).map { r =>
        if (!r.isTextual) throw new IllegalArgumentException(s"field 'runId' is $r, expected a string")
        r.asText()
      }
      val listed = files.elements().asScala.map(fileOf(_, source)).toSeq
      // each name is a file of the restored RocksDB directory: two entries cannot share one
      listed.groupBy(_.name).find(_._2.size > 1).foreach { case (name, same) =>
        throw new IllegalArgumentException(s"it lists the file name $name ${same.size} times")
      }
      SnapshotManifest(found, int(node, "keyGroups"), long(node, "numKeys"), listed,
        Option(node.get("replay")).filterNot(_.isNull).map(fileOf(_, source)), keyLayout, ttl,
        Option(node.get("rescale")).filterNot(_.isNull), runId)
    } catch {
      case e: UnsafePathException => throw e
      case NonFatal(e) => throw new CorruptManifestException(
        s"snapshot manifest $source is truncated or corrupt (${e.getMessage})", e)
    }

  private def long(node: JsonNode, field: String): Long = {
    val v = node.get(field)
    if (v == null || !v.canConvertToLong || !v.isIntegralNumber || v.asLong() < 0) {
      throw new IllegalArgumentException(s"field '$field' is $v, expected a non-negative integer")
    }
    v.asLong()
  }

  private def fileOf(node: JsonNode, source: String): SnapshotFile = {
    if (!node.isObject) throw new IllegalArgumentException("a file entry is not an object")
    SnapshotFile(CheckpointLayout.checkedFileName(node.path("name").asText(null), source),
      CheckpointLayout.checkedRelativePath(node.path("path").asText(null), source), long(node, "size"))
  }
}
