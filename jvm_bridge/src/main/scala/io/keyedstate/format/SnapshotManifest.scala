package io.keyedstate.format

import com.fasterxml.jackson.databind.JsonNode

/**
 * Which files make up the RocksDB snapshot of one version. `replay`: a changelog that holds the
 * whole version, applied onto `files` taken as version `version - 1` (written by the offline
 * rescale). `ttl` and `rescale` are informational objects, kept as read. `runId`: the query run
 * that uploaded the snapshot (absent in offline writers' and older manifests); a load under
 * checkpoint format 1 uses the snapshot only while the version's changelog names the same run.
 */
final case class SnapshotManifest(version: Long, keyGroups: Int, numKeys: Long, files: Seq[SnapshotFile],
    replay: Option[SnapshotFile] = None, keyLayout: Option[KeyLayout] = None,
    ttl: Option[java.util.Map[String, AnyRef]] = None, rescale: Option[JsonNode] = None,
    runId: Option[String] = None)
