import java.io.File;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * A real HDFS for the tests (tests/storage/conftest.py): a NameNode and DataNodes in this JVM,
 * on loopback ports chosen by the OS, data under args[0]. Prints "HDFS-READY hdfs://host:port" once
 * every DataNode has registered, then runs until its stdin closes (the test session ends, or the
 * process that started it dies), and shuts the cluster down.
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
        try {
            cluster.waitActive();
            cluster.waitClusterUp();
            System.out.println("HDFS-READY " + cluster.getURI());
            System.out.flush();
            while (System.in.read() != -1) {
                // nothing is read from stdin: its end is the signal to stop
            }
        } finally {
            cluster.shutdown(true);
        }
    }
}
