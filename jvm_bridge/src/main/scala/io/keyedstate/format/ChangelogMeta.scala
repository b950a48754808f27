package io.keyedstate.format

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.JsonNode

/** What a format-2 changelog says about itself beyond its records (see [[ChangelogFormat]]). */
final case class ChangelogMeta(keyLayout: Option[KeyLayout] = None, uniqueId: Option[String] = None,
    lineage: Seq[(Long, String)] = Nil, fromEmpty: Boolean = false, runId: Option[String] = None)

object ChangelogMeta {
  /** Format 2's metadata JSON of a changelog of `version` with `keyGroups` key groups. */
  def tree(version: Long, keyGroups: Int, meta: ChangelogMeta): java.util.Map[String, AnyRef] = {
    val tree = new java.util.LinkedHashMap[String, AnyRef]()
    tree.put("version", Long.box(version))
    tree.put("keyGroups", Int.box(keyGroups))
    meta.keyLayout.foreach(l => tree.put("keyLayout", ManifestFormat.keyLayoutTree(l)))
    meta.uniqueId.foreach(id => tree.put("uniqueId", id))
    if (meta.fromEmpty) tree.put("fromEmpty", java.lang.Boolean.TRUE)
    if (meta.lineage.nonEmpty) {
      tree.put("lineage", meta.lineage.map { case (v, id) => java.util.List.of(Long.box(v), id) }.asJava)
    }
    meta.runId.foreach(run => tree.put("runId", run))
    tree
  }

  /** The metadata in format 2's JSON `meta`; fails naming `source`. */
  def parse(meta: JsonNode, source: String): ChangelogMeta =
    try ChangelogMeta(
      Option(meta.get("keyLayout")).map(ManifestFormat.keyLayoutOf),
      Option(meta.get("uniqueId")).filterNot(_.isNull).map(_.asText()),
      Option(meta.get("lineage")).filterNot(_.isNull).map(_.elements().asScala.map(i => (i.get(0).asLong(), i.get(1).asText())).toSeq)
        .getOrElse(Nil),
      Option(meta.get("fromEmpty")).exists(_.asBoolean()),
      Option(meta.get("runId")).filterNot(_.isNull).map { r =>
        if (!r.isTextual) throw new IllegalArgumentException(s"field 'runId' is $r, expected a string")
        r.asText()
      }) catch {
      case NonFatal(e) => throw new CorruptChangelogException(s"$source has unreadable metadata (${e.getMessage})")
    }
}
