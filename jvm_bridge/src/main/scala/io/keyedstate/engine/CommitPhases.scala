package io.keyedstate.engine

/** Where a commit's time went, in ms: encoding the changelog (and updating the near cache),
 *  writing it to the checkpoint, shipping it to Python. In a write-behind commit the write (on
 *  its own thread) and the ship (hold, then release) overlap: the latency is about encode plus
 *  the longer of the two, not their sum. */
final case class CommitPhases(encodeMs: Long, writeMs: Long, shipMs: Long)
