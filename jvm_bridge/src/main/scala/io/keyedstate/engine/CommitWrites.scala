package io.keyedstate.engine

import java.util.concurrent.{Callable, ExecutionException, Executors, FutureTask}

/**
 * Writes write-behind commits' changelog files to the checkpoint on threads of their own, so that
 * the task thread ships the same changelog to the state server meanwhile ([[StoreEngine.commit]]).
 * One thread per commit in flight, at most one per task slot.
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
