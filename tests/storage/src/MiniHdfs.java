import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Deque;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

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
 */
public final class MiniHdfs {
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
