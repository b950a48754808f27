package io.keyedstate.engine

import java.time.Duration
import java.util.concurrent.{Executors, RejectedExecutionException, TimeUnit}
import java.util.concurrent.atomic.AtomicInteger

import scala.util.control.NonFatal

import org.apache.hadoop.fs.FileSystem
import org.apache.hadoop.util.ShutdownHookManager
import org.slf4j.LoggerFactory

import io.keyedstate.bridge.StateServerProcess

/**
 * Uploads a snapshot as soon as the server has staged it, on a few background threads per
 * executor (an upload mostly waits: for the server to finish applying, for the file system),
 * instead of at the next maintenance tick (60 s by default): a query stopped in between would
 * otherwise restart by replaying every changelog since the previous snapshot. Maintenance still
 * uploads whatever this missed; both go through [[StoreEngine.uploadSnapshots]].
 *
 * The same holds when the application stops right after a snapshot version: at the JVM's exit,
 * uploads already asked for are given up to [[ExitWait]] to finish, before Hadoop closes its
 * file systems (a Hadoop shutdown hook above theirs) and before the state servers stop. An
 * upload cut short leaves no manifest, so nothing half-written is ever loaded.
 *
 * Cleanup is Spark's maintenance's too, and a run shorter than its interval (a scheduled
 * availableNow job) never gets one: each run's first load therefore cleans up once, here, on
 * what earlier runs uploaded, counting from the version it loaded. Cleanups run on a thread of
 * their own that the JVM's exit does not wait for (an interrupted cleanup only leaves files for
 * the next one), so they never delay the uploads that exit does wait for.
 */
private object SnapshotKick {
  private val ExitWait = Duration.ofSeconds(30)
  private val log = LoggerFactory.getLogger("io.keyedstate.engine.SnapshotKick")
  private val pending = new AtomicInteger
  private def daemons(threads: Int, name: String) = Executors.newFixedThreadPool(threads, (r: Runnable) => {
    val t = new Thread(r, name)
    t.setDaemon(true)
    t
  })
  private val thread = daemons(4, "keyedstate-snapshot-upload")
  private val cleaner = daemons(1, "keyedstate-cleanup")
  private val drain: Runnable = () => {
    if (pending.get > 0) log.info(s"keyedstate: finishing ${pending.get} snapshot upload(s) before the JVM exits " +
      s"(at most ${ExitWait.getSeconds} s)")
    thread.shutdown()
    if (!thread.awaitTermination(ExitWait.toMillis, TimeUnit.MILLISECONDS)) {
      log.warn(s"keyedstate: ${pending.get} snapshot upload(s) did not finish before the JVM exits; " +
        "the next run uploads or replaces them")
    }
  }
  StateServerProcess.runBeforeServersStop(drain)
  try ShutdownHookManager.get().addShutdownHook(drain, FileSystem.SHUTDOWN_HOOK_PRIORITY + 20, ExitWait.getSeconds + 5, TimeUnit.SECONDS)
  catch { case NonFatal(_) => } // first used while the JVM already exits: the servers' hook still drains

  def request(engine: StoreEngine, version: Long): Unit = {
    val dir = engine.files.dir.toString
    val upload = begin(dir, version)
    if (!submit(try engine.uploadSnapshots(version) finally end(dir, upload))) end(dir, upload)
  }

  /** Runs the upload of `version`'s snapshot of the store partition in `dir` on the caller's
   *  thread (a provider's close), counted as in flight for [[awaitUploads]]. */
  def uploading(dir: String, version: Long)(work: => Unit): Unit = {
    val upload = begin(dir, version)
    try work finally end(dir, upload)
  }

  /**
   * Waits, at most [[LoadWait]], until no upload of a snapshot at or below `version` of the store
   * partition in `dir` is in flight in this JVM. A new run's first load of a partition this
   * executor served just before (a query restarted in the same application) then starts from
   * the snapshot the previous run's last snapshot commit asked for, instead of replaying every
   * changelog since the one before: that upload waits for its version's apply behind, and a load
   * that did not wait for it would replay every changelog since the snapshot before. A load on
   * another executor cannot wait, and replays as before; so does a load once a wait for this
   * partition gave up, until a newer upload begins.
   */
  def awaitUploads(dir: String, version: Long, describe: String): Unit = {
    val started = System.nanoTime()
    val deadline = started + LoadWait.toNanos
    val outcome = inFlight.synchronized {
      // Uploads of versions the load can start from, and begun since a load last gave up on
      // this partition: a hung upload costs one wait, not one per load.
      def awaited = inFlight.getOrElse(dir, Nil).exists(u => u.version <= version && u.begun > gaveUp.getOrElse(dir, Long.MinValue))
      if (!awaited) None
      else {
        while (awaited && System.nanoTime() < deadline) inFlight.wait(math.max(1L, (deadline - System.nanoTime()) / 1000000))
        if (awaited) gaveUp(dir) = System.nanoTime()
        Some(!awaited)
      }
    }
    val waited = (System.nanoTime() - started) / 1000000
    outcome.foreach { finished =>
      if (finished) log.info(s"keyedstate: loading $describe waited $waited ms for the snapshot upload in flight")
      else log.warn(s"keyedstate: loading $describe without the snapshot upload still in flight after $waited ms; " +
        "the load replays the changelogs since the last snapshot uploaded")
    }
  }

  private val LoadWait = Duration.ofSeconds(20)
  private final class Upload(val version: Long, val begun: Long)
  private val inFlight = scala.collection.mutable.Map.empty[String, List[Upload]] // per partition directory
  private val gaveUp = scala.collection.mutable.Map.empty[String, Long] // per partition directory: when a load last did

  private def begin(dir: String, version: Long): Upload = inFlight.synchronized {
    val upload = new Upload(version, System.nanoTime())
    inFlight(dir) = upload :: inFlight.getOrElse(dir, Nil)
    upload
  }

  private def end(dir: String, upload: Upload): Unit = inFlight.synchronized {
    val left = inFlight.getOrElse(dir, Nil).filterNot(_ eq upload)
    if (left.isEmpty) inFlight.remove(dir) else inFlight(dir) = left
    inFlight.notifyAll()
  }

  def cleanUp(engine: StoreEngine, loaded: (Long, Option[String])): Unit =
    cleaner.execute(() => engine.cleanupFiles(Some(loaded)))

  /** Whether `work` was queued (not when the JVM exits). */
  private def submit(work: => Unit): Boolean = {
    pending.incrementAndGet()
    try { thread.execute(() => try work finally pending.decrementAndGet()); true }
    catch { case _: RejectedExecutionException => pending.decrementAndGet(); false } // exiting
  }
}
