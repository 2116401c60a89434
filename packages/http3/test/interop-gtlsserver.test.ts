// Interop with an independent HTTP/3 server: our client against Debian's ngtcp2 `gtlsserver`
// (nghttp3 inside) serving files: GET, HEAD, 404, a 4 MiB file, concurrent requests on one
// connection, our QPACK encoder with the dynamic table against nghttp3's decoder, and
// resumption with the ticket gtlsserver issued.
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { Http3ClientSession } from '../src/index.ts';
import { makePki, requireTool, spawnChild, tempDir, waitForUdpPort } from './net-helpers.ts';

const gtlsserver = requireTool(t, 'gtlsserver', 'ngtcp2-server');
const pki = makePki(t);
const htdocs = path.join(tempDir(t), 'htdocs');
mkdirSync(htdocs);
writeFileSync(path.join(htdocs, 'index.html'), '<!doctype html><title>hi</title>\n');
const big = randomBytes(4 * 1024 * 1024);
writeFileSync(path.join(htdocs, 'big.bin'), big);

const server = spawnChild(t, gtlsserver, ['-q', `--htdocs=${htdocs}`, '--timeout=20s', '127.0.0.1', '0', pki.keyFile, pki.certFile]);
const port = await waitForUdpPort(server.proc.pid as number);

async function connect(options: { sessionTicket?: Uint8Array; qpackEncoderDynamicTable?: boolean } = {}): Promise<Http3ClientSession> {
  const client = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: pki.caPem, localHost: '127.0.0.1', ...options });
  t.teardown(() => client.close(true));
  return client;
}

t.test('GET, HEAD and 404', async (t) => {
  const client = await connect();
  const get = await client.fetch({ path: '/index.html' });
  t.equal(get.status, 200);
  t.equal(get.headers['content-type'], 'text/html');
  t.equal(get.body.toString(), '<!doctype html><title>hi</title>\n');
  t.match(String(get.headers['server']), /nghttp3/);
  const head = await client.fetch({ method: 'HEAD', path: '/index.html' });
  t.equal(head.status, 200);
  t.equal(head.headers['content-length'], String(get.body.length));
  t.equal(head.body.length, 0);
  const missing = await client.fetch({ path: '/missing' });
  t.equal(missing.status, 404);
  t.ok(client.peerSettings.qpackMaxTableCapacity > 0, "gtlsserver's SETTINGS were applied");
  await client.close();
});

t.test('a 4 MiB file and 50 concurrent requests on one connection', async (t) => {
  const client = await connect();
  const file = await client.fetch({ path: '/big.bin' });
  t.equal(file.body.length, big.length);
  t.equal(createHash('sha256').update(file.body).digest('hex'), createHash('sha256').update(big).digest('hex'));
  const all = await Promise.all(Array.from({ length: 50 }, () => client.fetch({ path: '/index.html' })));
  t.ok(all.every((r) => r.status === 200 && r.body.length > 0), 'all 50 answered');
  await client.close();
});

t.test('our QPACK dynamic table against the nghttp3 decoder', async (t) => {
  const client = await connect({ qpackEncoderDynamicTable: true });
  for (let i = 0; i < 20; i++) {
    const r = await client.fetch({ path: '/index.html', headers: { 'x-tenant': 'acme-corporation', 'user-agent': 'edge-proxy-probe/1.0', accept: 'text/html' } });
    t.equal(r.status, 200, `request ${i}`);
  }
  t.ok(client.qpackInserts.sent >= 3, `our encoder inserted into nghttp3's table (${client.qpackInserts.sent} entries)`);
  t.equal(client.closeReason.by, 'unknown', 'no QPACK error closed the connection');
  await client.close();
});

t.test('resumption with the ticket gtlsserver issued', async (t) => {
  const first = await connect();
  await first.fetch({ path: '/index.html' });
  const ticket = first.ticket();
  t.ok(ticket !== undefined && ticket.length > 0, 'a session ticket arrived');
  t.equal(first.info.resumed, false);
  await first.close();
  const second = await connect({ sessionTicket: ticket as Uint8Array });
  t.equal(second.info.resumed, true, 'the second handshake resumed');
  t.equal((await second.fetch({ path: '/index.html' })).status, 200);
  await second.close();
});

t.test('gtlsserver is still running', async (t) => {
  t.equal(server.proc.exitCode, null);
});
