package io.keyedstate.testing;

import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;

import org.apache.spark.SparkEnv;
import org.apache.spark.sql.execution.streaming.state.StateStore$;
import org.apache.spark.sql.execution.streaming.state.StateStoreCoordinatorRef;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.storage.BlockManagerId;

/**
 * Spark's state store coordinator and loaded providers, for tests that drive provider lifetimes
 * the way Spark's StateStore does (py4j cannot reflect on SparkEnv: some of its method signatures
 * name classes that are not on the classpath).
 */
public final class StateStores {
    private StateStores() {}

    /** The coordinator, created if no query has started one yet (on the driver: local mode). */
    private static StateStoreCoordinatorRef coordinator() {
        return StateStoreCoordinatorRef.forDriver(SparkEnv.get(), org.apache.spark.sql.internal.SQLConf.get());
    }

    private static StateStoreProviderId providerId(StateStoreId id, String runId) {
        return new StateStoreProviderId(id, UUID.fromString(runId));
    }

    /** What StateStore.get reports when a task of run {@code runId} opens store {@code id} here. */
    public static void reportActive(StateStoreId id, String runId) {
        BlockManagerId here = SparkEnv.get().blockManager().blockManagerId();
        coordinator().reportActiveInstance(providerId(id, runId), here.host(), here.executorId(),
                noIds());
    }

    @SuppressWarnings("unchecked")
    private static scala.collection.immutable.Seq<StateStoreProviderId> noIds() {
        return (scala.collection.immutable.Seq<StateStoreProviderId>) (Object) scala.collection.immutable.Nil$.MODULE$;
    }

    /** What Spark does when a query run stops: the coordinator forgets its instances. */
    public static void deactivate(String runId) {
        coordinator().deactivateInstances(UUID.fromString(runId));
    }

    /** Spark's own question before it closes a provider in maintenance. */
    public static boolean isActive(StateStoreId id, String runId) {
        return coordinator().verifyIfInstanceActive(providerId(id, runId), SparkEnv.get().blockManager().blockManagerId().executorId());
    }

    /** Stops the maintenance task; the next StateStore.get starts it with its query's interval. */
    public static void stopMaintenance() {
        StateStore$.MODULE$.stopMaintenanceTask();
    }

    /** The providers StateStore has loaded in this JVM (its private {@code loadedProviders}). */
    @SuppressWarnings("unchecked")
    public static List<Object[]> loadedProviders() throws ReflectiveOperationException {
        Field field = StateStore$.class.getDeclaredField("loadedProviders");
        field.setAccessible(true);
        scala.collection.mutable.HashMap<StateStoreProviderId, StateStoreProvider> loaded =
                (scala.collection.mutable.HashMap<StateStoreProviderId, StateStoreProvider>) field.get(StateStore$.MODULE$);
        List<Object[]> out = new ArrayList<>();
        synchronized (loaded) {
            scala.collection.Iterator<scala.Tuple2<StateStoreProviderId, StateStoreProvider>> it = loaded.iterator();
            while (it.hasNext()) {
                scala.Tuple2<StateStoreProviderId, StateStoreProvider> e = it.next();
                out.add(new Object[] {e._1(), e._2()});
            }
        }
        return out;
    }

    /**
     * Commits {@code store} on a thread of its own and interrupts that thread, as Spark's task
     * kill does, once the thread waits in a frame whose class name contains {@code waitingIn}
     * (polled from its stack). Returns {committed version or null, the exception's message or
     * null, whether the thread's interrupt flag was still set when commit ended, ms from the
     * interrupt to commit's end}.
     */
    public static Object[] commitKilledWhileIn(org.apache.spark.sql.execution.streaming.state.StateStore store,
                                               String waitingIn, long timeoutMs) throws InterruptedException {
        Object[] out = new Object[4];
        long[] ended = new long[1];
        Thread task = new Thread(() -> {
            try {
                out[0] = store.commit();
            } catch (Throwable e) {
                out[1] = String.valueOf(e);
            }
            out[2] = Thread.currentThread().isInterrupted();
            ended[0] = System.nanoTime();
        }, "killed-commit");
        task.start();
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        while (!waitsIn(task, waitingIn)) {
            if (!task.isAlive() || System.nanoTime() > deadline) {
                task.join();
                throw new IllegalStateException("the commit never waited in " + waitingIn + ": " + out[0] + " " + out[1]);
            }
            Thread.sleep(5);
        }
        long killed = System.nanoTime();
        task.interrupt();
        task.join();
        out[3] = (ended[0] - killed) / 1_000_000L;
        return out;
    }

    private static boolean waitsIn(Thread thread, String className) {
        for (StackTraceElement frame : thread.getStackTrace()) {
            if (frame.getClassName().contains(className)) return true;
        }
        return false;
    }

    /** A function that appends every chunk it is handed to one array and counts their sizes
     *  (py4j cannot implement a Scala function). */
    public static ChunkCollector chunkCollector() {
        return new ChunkCollector();
    }

    public static final class ChunkCollector
            extends scala.runtime.AbstractFunction1<java.nio.ByteBuffer, scala.runtime.BoxedUnit> {
        private final java.io.ByteArrayOutputStream bytes = new java.io.ByteArrayOutputStream();
        private final java.util.TreeSet<Integer> sizesButLast = new java.util.TreeSet<>();
        private int last = -1;

        @Override
        public scala.runtime.BoxedUnit apply(java.nio.ByteBuffer chunk) {
            if (last >= 0) sizesButLast.add(last);
            last = chunk.remaining();
            byte[] copy = new byte[last];
            chunk.get(copy);
            bytes.writeBytes(copy);
            return scala.runtime.BoxedUnit.UNIT;
        }

        public byte[] bytes() { return bytes.toByteArray(); }
        /** The distinct sizes of every chunk but the last, as text ("[4096]"). */
        public String sizesButLast() { return sizesButLast.toString(); }
        public int last() { return last; }
    }
}
