import java.io.BufferedReader;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Deque;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.server.namenode.AuditLogger;
import org.apache.hadoop.ipc.DefaultRpcScheduler;
import org.apache.hadoop.ipc.ProcessingDetails;
import org.apache.hadoop.ipc.RpcScheduler;
import org.apache.hadoop.ipc.Schedulable;

/**
 * A real HDFS for the tests (tests/storage/conftest.py): a NameNode and DataNodes in this JVM,
 * on loopback ports chosen by the OS, data under args[0]. Prints "HDFS-READY hdfs://host:port" once
 * every DataNode has registered, then runs until its stdin closes (the test session ends, or the
 * process that started it dies), and shuts the cluster down.
 *
 * Each line on stdin is a command, answered by one line "CTL OK <command> ..." or "CTL ERR <command> <why>":
 * "stop-datanode" stops the first running DataNode (its blocks stay on disk), "restart-datanode"
 * starts the DataNode stopped longest ago on its old ports, "restart-namenode" restarts the NameNode
 * on its old ports and answers once it has left safe mode (every DataNode reported its blocks).
 *
 * With the system property minihdfs.requests (a file), every request the NameNode serves is
 * appended there as it is answered: "A<TAB>epochMillis<TAB>cmd<TAB>src<TAB>dst<TAB>ok" for each audited
 * client call (create, open, getfileinfo, listStatus, rename, delete, mkdirs, ...: HDFS's audit log,
 * with paths) and "R<TAB>epochMillis<TAB>method" for each RPC (addBlock, complete, fsync, renewLease
 * and the DataNodes' heartbeats and block reports too: every call an IPC server of this JVM handles).
 */
public final class MiniHdfs {
    static final String REQUESTS = "minihdfs.requests";
    static final String SCHEDULER_KEY = "ipc.%d.scheduler.impl";

    /** The request log: whole lines, written through (no buffer), so a reader sees every answered request. */
    static final class RequestLog {
        private static OutputStream out;

        static synchronized void write(String line) {
            try {
                if (out == null) {
                    String path = System.getProperty(REQUESTS);
                    if (path == null) {
                        return;
                    }
                    out = new FileOutputStream(path, true);
                }
                out.write((line + "\n").getBytes(StandardCharsets.UTF_8));
            } catch (IOException e) {
                throw new IllegalStateException("cannot write the request log", e);
            }
        }
    }

    /** dfs.namenode.audit.loggers: every audited client call, with its paths. */
    public static final class AuditFile implements AuditLogger {
        @Override
        public void initialize(Configuration conf) {
        }

        @Override
        public void logAuditEvent(boolean succeeded, String user, InetAddress addr, String cmd, String src, String dst,
                                  FileStatus stat) {
            RequestLog.write("A\t" + System.currentTimeMillis() + "\t" + cmd + "\t" + src + "\t" + dst + "\t"
                             + (succeeded ? "ok" : "denied"));
        }
    }

    /** ipc.<port>.scheduler.impl: Hadoop's default scheduler, told of every call an IPC server answered. */
    public static final class RpcFile extends DefaultRpcScheduler {
        public RpcFile(int priorityLevels, String namespace, Configuration conf) {
            super(priorityLevels, namespace, conf);
        }

        @Override
        public void addResponseTime(String callName, Schedulable schedulable, ProcessingDetails details) {
            RequestLog.write("R\t" + System.currentTimeMillis() + "\t" + callName);
            super.addResponseTime(callName, schedulable, details);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: MiniHdfs <base dir> <datanodes>");
            System.exit(2);
        }
        int dataNodes = Integer.parseInt(args[1]);
        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(args[0]).getAbsolutePath());
        // every block on two DataNodes: a write completes only once both hold it
        conf.setInt("dfs.replication", Math.min(2, dataNodes));
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
        if (System.getProperty(REQUESTS) != null) {
            conf.set("dfs.namenode.audit.loggers", AuditFile.class.getName());
            // an IPC server's scheduler is named by the port it was asked for: 0 (the OS chooses)
            conf.setClass(String.format(SCHEDULER_KEY, 0), RpcFile.class, RpcScheduler.class);
        }
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
            .numDataNodes(dataNodes)
            .nameNodePort(0)
            .format(true)
            .build();
        Deque<MiniDFSCluster.DataNodeProperties> stopped = new ArrayDeque<>();
        try {
            cluster.waitActive();
            cluster.waitClusterUp();
            System.out.println("HDFS-READY " + cluster.getURI());
            System.out.flush();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                String command = line.trim();
                if (command.isEmpty()) {
                    continue;
                }
                try {
                    String said = control(cluster, stopped, command);
                    System.out.println("CTL OK " + command + (said.isEmpty() ? "" : " " + said));
                } catch (Exception e) {
                    e.printStackTrace();
                    System.out.println("CTL ERR " + command + " " + String.valueOf(e).replace('\n', ' '));
                }
                System.out.flush();
            }
        } finally {
            cluster.shutdown(true);
        }
    }

    private static String control(MiniDFSCluster cluster, Deque<MiniDFSCluster.DataNodeProperties> stopped,
                                  String command) throws Exception {
        switch (command) {
            case "stop-datanode": {
                if (cluster.getDataNodes().isEmpty()) {
                    throw new IllegalStateException("no running DataNode");
                }
                MiniDFSCluster.DataNodeProperties dn = cluster.stopDataNode(0);
                stopped.addLast(dn);
                return dn.getDatanode() == null ? "" : String.valueOf(dn.getDatanode().getDatanodeId().getXferPort());
            }
            case "restart-datanode": {
                MiniDFSCluster.DataNodeProperties dn = stopped.pollFirst();
                if (dn == null) {
                    throw new IllegalStateException("no stopped DataNode");
                }
                cluster.restartDataNode(dn, true);
                cluster.waitActive();
                return "";
            }
            case "restart-namenode": {
                // it comes back on its old port, which now names its scheduler
                Configuration nnConf = cluster.getConfiguration(0);
                if (nnConf.getClass(String.format(SCHEDULER_KEY, 0), null) != null) {
                    nnConf.setClass(String.format(SCHEDULER_KEY, cluster.getNameNodePort()), RpcFile.class,
                                    RpcScheduler.class);
                }
                cluster.restartNameNode(true);
                cluster.waitActive();
                long deadline = System.currentTimeMillis() + 120_000;
                while (cluster.getNameNode().isInSafeMode()) {
                    if (System.currentTimeMillis() > deadline) {
                        throw new IllegalStateException("the NameNode is still in safe mode after 120 s");
                    }
                    Thread.sleep(100);
                }
                return cluster.getURI().toString();
            }
            default:
                throw new IllegalArgumentException("unknown command");
        }
    }
}
