package io.keyedstate.engine

import java.util.concurrent.{Callable, ExecutionException, Executors, FutureTask}

import scala.util.control.NonFatal

import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream

/**
 * Writes write-behind commits' changelog files to the checkpoint on threads of their own, so that
 * the task thread ships the same changelog to the state server meanwhile ([[StoreEngine.commit]]),
 * and opens a version's changelog file while its task still computes ([[open]]). One thread per
 * commit in flight or file opening, at most two per task slot.
 */
private object CommitWrites {
  private val pool = Executors.newCachedThreadPool((r: Runnable) => {
    val t = new Thread(r, "keyedstate-commit-write")
    t.setDaemon(true)
    t
  })

  /** Starts `write` on a pool thread; its result and ms come from [[await]]. */
  def start(write: () => Boolean): Write = {
    val w = new Write(write)
    pool.execute(w.task)
    w
  }

  /** Starts `open` on a pool thread; the commit takes the stream ([[Opening.take]]), or
   *  [[Opening.cancel]] drops it. */
  def open(open: () => CancellableFSDataOutputStream): Opening = {
    val o = new Opening(open)
    pool.execute(o.task)
    o
  }

  /** A changelog file being opened ahead of its commit; taken once, or cancelled. */
  final class Opening(open: () => CancellableFSDataOutputStream) {
    // Under this Opening's lock: the opener hands its stream over here unless cancelled first,
    // so exactly one of the opener and cancel() drops a stream nobody takes.
    private var cancelled = false
    private var taken = false
    private var opened: CancellableFSDataOutputStream = _
    private[CommitWrites] val task = new FutureTask[CancellableFSDataOutputStream](() => {
      val out = open()
      if (Opening.this.synchronized { if (!cancelled) opened = out; cancelled }) drop(out)
      out
    })

    /** The open stream, waiting for the open (a failed open's error is rethrown: the commit fails
     *  as if it had opened the file itself). Interrupted (a task kill), the open is cancelled and
     *  the thread keeps its interrupt for Spark. None once cancelled (a later store of the
     *  partition was handed out): the commit opens the file itself. */
    def take(): Option[CancellableFSDataOutputStream] = {
      synchronized {
        if (taken) throw new IllegalStateException("keyedstate: a changelog opened ahead was taken twice")
        if (cancelled) return None
        taken = true
      }
      try Some(task.get()) catch {
        case e: InterruptedException =>
          synchronized { taken = false }
          cancel()
          Thread.currentThread().interrupt()
          throw e
        case e: ExecutionException => throw e.getCause
      }
    }

    /** Drops the stream unless a commit took it: publishes nothing, and removes what the open made
     *  (a temporary file), off the caller's thread. Idempotent. */
    def cancel(): Unit = {
      val out = synchronized {
        if (cancelled || taken) return
        cancelled = true
        opened
      }
      if (out != null) pool.execute(() => drop(out))
    }

    private def drop(out: CancellableFSDataOutputStream): Unit = try out.cancel() catch { case NonFatal(_) => }
  }

  final class Write(write: () => Boolean) {
    private var runner: Thread = _ // under this Write's lock, like `stopped`
    private var stopped = false
    private[CommitWrites] val task = new FutureTask[(Boolean, Long)](new Callable[(Boolean, Long)] {
      override def call(): (Boolean, Long) = {
        Write.this.synchronized {
          runner = Thread.currentThread()
          if (stopped) runner.interrupt() // asked before it started
        }
        try {
          val t0 = System.nanoTime()
          val written = write()
          (written, (System.nanoTime() - t0) / 1000000)
        } finally Write.this.synchronized { runner = null }
      }
    })

    /** Interrupts the write, as a task kill would if it ran on the task thread; never another
     *  write the same pool thread runs later (the pool clears the flag between tasks). */
    def interrupt(): Unit = synchronized {
      stopped = true
      if (runner != null) runner.interrupt()
    }
  }

  /**
   * The write's outcome once it is done, and whether the caller was interrupted meanwhile (its
   * flag is cleared; the caller sets it again when done). An interrupt (Spark killing the task)
   * is passed on to the write, as if it ran on the task thread, but the wait goes on until the
   * write has stopped: a commit never returns while its file may still be written.
   */
  def await(write: Write): (Either[Throwable, (Boolean, Long)], Boolean) = {
    var interrupted = false
    while (true) {
      try return (Right(write.task.get()), interrupted)
      catch {
        case _: InterruptedException => interrupted = true; write.interrupt()
        case e: ExecutionException => return (Left(e.getCause), interrupted)
      }
    }
    throw new IllegalStateException("unreachable")
  }
}
