package org.apache.spark.keyedstate

import org.apache.spark.util.NextIterator

import io.keyedstate.checkpoint.CheckpointFileException

/**
 * One of two keyedstate classes in Spark's namespace (the other: [[SparkErrors]]), and why:
 * Spark's change-feed SPI (`SupportsFineGrainedReplay.getStateStoreChangeDataReader`) returns
 * `org.apache.spark.util.NextIterator`, which is `private[spark]`, so code in `io.keyedstate`
 * cannot name or extend it. This adapter extends it and exposes two public hooks; everything
 * else lives in `io.keyedstate.offline` ([[io.keyedstate.offline.ChangeFeed]]).
 */
abstract class ChangeIterator[U] extends NextIterator[U] {
  /** The next element, or None at the end. */
  protected def advance(): Option[U]

  /** Called once, when Spark closes the iterator (also after an error). */
  protected def release(): Unit

  // A changelog that cannot be read is Spark's CANNOT_LOAD_STATE_STORE, as when the feed opens.
  override protected def getNext(): U = (try advance() catch {
    case e: CheckpointFileException => throw SparkErrors.cannotLoadStateStore(e)
  }) match {
    case Some(u) => u
    case None =>
      finished = true
      null.asInstanceOf[U]
  }

  override protected def close(): Unit = release()
}
