// A port free on both TCP and UDP on 127.0.0.1, for tests where several processes must bind the
// same port with SO_REUSEPORT (port 0 would give each its own). Bound and released at once; the
// window before the test binds it again is short and the port is from the ephemeral range.
import dgram from 'node:dgram';
import net from 'node:net';
import { once } from 'node:events';

export async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const server = net.createServer();
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const port = (server.address() as net.AddressInfo).port;
    const udp = dgram.createSocket('udp4');
    const ok = await new Promise<boolean>((resolve) => {
      udp.once('error', () => resolve(false));
      udp.bind(port, '127.0.0.1', () => resolve(true));
    });
    udp.close();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    if (ok) return port;
  }
  throw new Error('no port free on both TCP and UDP');
}
