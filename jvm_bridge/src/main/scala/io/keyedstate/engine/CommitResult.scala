package io.keyedstate.engine

/** What a commit produced: the new version, its changelog size, its TTL cleanup. */
final case class CommitResult(version: Long, changelogBytes: Long, ttlCleanedUp: Long, ttlCleanupMs: Long,
    uniqueId: Option[String] = None, baseUniqueId: Option[String] = None)
