package io.keyedstate.bridge

import java.net.{InetAddress, Socket}
import java.nio.file.Path
import javax.net.SocketFactory

/**
 * py4j's connections to a state server's callback server, over its Unix domain socket (in a
 * directory private to the user: no other local user can connect to it, nor take the connections
 * a query needs). py4j wants a java.net.Socket, and Java's socket adaptor is for TCP only: this
 * factory makes [[UnixChannelSocket]]s, whatever host and port py4j names.
 */
private[bridge] final class UnixSocketFactory(path: Path) extends SocketFactory {
  override def createSocket(): Socket = throw new UnsupportedOperationException("a connected socket only")
  override def createSocket(host: String, port: Int): Socket = new UnixChannelSocket(path)
  override def createSocket(host: String, port: Int, local: InetAddress, localPort: Int): Socket =
    new UnixChannelSocket(path)
  override def createSocket(host: InetAddress, port: Int): Socket = new UnixChannelSocket(path)
  override def createSocket(host: InetAddress, port: Int, local: InetAddress, localPort: Int): Socket =
    new UnixChannelSocket(path)
}
