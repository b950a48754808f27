package io.keyedstate.engine

import java.util.UUID

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.spark.SparkEnv
import org.apache.spark.sql.execution.streaming.state.{StateStoreCoordinatorRef, StateStoreId, StateStoreProviderId}
import org.slf4j.LoggerFactory

/**
 * Which query run a store belongs to, and whether Spark still counts it as that run's active
 * instance of the store. A stopped run's provider lives on until Spark's maintenance closes it
 * (up to a maintenance interval), and a provider on a lost executor lives on while another runs
 * the partition: neither may upload snapshots or delete files while the active instance works on
 * the same directory. Spark's StateStore sets the run id in the hadoopConf it gives `init`;
 * stores opened without one (the state data source, offline tools) are never active.
 */
final class RunFence(id: StateStoreId, hadoopConf: Configuration) {
  import RunFence._

  /** The query run id (`sql.streaming.runId`), or None outside a running query. */
  val runId: Option[String] = Option(hadoopConf.get(RunIdKey)).filter(_.nonEmpty)

  /** Asks the driver's state store coordinator (one RPC); false when it cannot tell. */
  def isActive: Boolean = runId.exists { run =>
    try {
      val env = SparkEnv.get
      val coordinator = StateStoreCoordinatorRef.forExecutor(env)
      // private[sql] in Scala, public in bytecode: the only way for a provider to ask.
      val verify = classOf[StateStoreCoordinatorRef].getMethod("verifyIfInstanceActive",
        classOf[StateStoreProviderId], classOf[String])
      verify.invoke(coordinator, StateStoreProviderId(id, UUID.fromString(run)),
        env.blockManager.blockManagerId.executorId).asInstanceOf[Boolean]
    } catch {
      case NonFatal(e) if noCoordinator(e) =>
        // Spark starts the coordinator with the session's first streaming query: none ran here
        // (a state data source read in a fresh session), so no run of this store is active.
        log.debug(s"keyedstate: no state store coordinator runs; $id of run $run is not active")
        false
      case NonFatal(e) =>
        log.warn(s"keyedstate: cannot ask the coordinator whether $id of run $run is active; treating it as not", e)
        false
    }
  }
}

object RunFence {
  val RunIdKey = "sql.streaming.runId"
  private val log = LoggerFactory.getLogger(classOf[RunFence])

  // private[rpc] in Spark: matched by name.
  private def noCoordinator(e: Throwable): Boolean = Iterator.iterate(e)(_.getCause).takeWhile(_ != null).take(16)
    .exists(_.getClass.getName == "org.apache.spark.rpc.RpcEndpointNotFoundException")
}
