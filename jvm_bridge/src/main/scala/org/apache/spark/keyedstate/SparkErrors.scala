package org.apache.spark.keyedstate

import org.apache.spark.{QueryContext, SparkException, SparkIllegalArgumentException}

/**
 * Spark's error classes that keyedstate raises, built here because `SparkIllegalArgumentException`
 * is `private[spark]`. Which class fits which failure is the callers' decision
 * ([[io.keyedstate.spark.DriverConfCheck]], [[io.keyedstate.spark.KeyedStateProvider]]).
 */
object SparkErrors {
  /** `INVALID_CONF_VALUE.REQUIREMENT`: "The value '<value>' in the config "<conf>" is invalid.
   *  <requirement>" (an IllegalArgumentException, as Spark raises it for its own confs). */
  def invalidConfValue(conf: String, value: String, requirement: String): IllegalArgumentException =
    new SparkIllegalArgumentException("INVALID_CONF_VALUE.REQUIREMENT",
      Map("confName" -> conf, "confValue" -> value, "confRequirement" -> requirement))

  /** `CANNOT_LOAD_STATE_STORE.UNCATEGORIZED` with `cause` as its cause, as Spark's own providers
   *  report a failed load; its message is "[<class>] <cause's message>" because the class's own
   *  text ("An error occurred during loading state.") would hide which file is at fault. */
  def cannotLoadStateStore(cause: Throwable): SparkException = {
    val condition = "CANNOT_LOAD_STATE_STORE.UNCATEGORIZED"
    new SparkException(s"[$condition] ${cause.getMessage}", cause, Some(condition), Map.empty[String, String],
      Array.empty[QueryContext])
  }
}
