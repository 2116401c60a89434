// Hop-by-hop removal (RFC 9110 §7.6.1) for every shape of `Connection`: the common single tokens
// take a shortcut, lists and repeated fields are parsed, and only the fields they name go.
import t from 'tap';
import { endToEnd, upstreamRequestHeaders } from '../src/upstream/headers.ts';

const base = { 'x-a': '1', 'x-b': '2', 'keep-alive': 'timeout=5', te: 'trailers', accept: '*/*' };

t.test('Connection values name the fields to drop, whatever their spelling', async (t) => {
  const cases: [string | string[], string[]][] = [
    ['keep-alive', ['x-a', 'x-b', 'accept']],
    ['close', ['x-a', 'x-b', 'accept']],
    ['upgrade', ['x-a', 'x-b', 'accept']],
    ['Keep-Alive, X-A', ['x-b', 'accept']],
    [' x-b ,close', ['x-a', 'accept']],
    [['close', 'x-a'], ['x-b', 'accept']],
    [['keep-alive', 'X-B, , accept'], ['x-a']],
    ['', ['x-a', 'x-b', 'accept']],
  ];
  for (const [connection, kept] of cases) {
    const out = endToEnd({ ...base, connection });
    t.same(Object.keys(out), kept, `Connection: ${JSON.stringify(connection)}`);
  }
});

t.test('an Upgrade exchange keeps Upgrade and Connection when asked to', async (t) => {
  const out = endToEnd({ connection: 'upgrade', upgrade: 'websocket', 'x-a': '1' }, true);
  t.same(out, { connection: 'upgrade', upgrade: 'websocket', 'x-a': '1' });
  t.same(endToEnd({ connection: 'upgrade', upgrade: 'websocket', 'x-a': '1' }), { 'x-a': '1' });
});

t.test("a client's forwarding headers are replaced, via is appended (docs/decisions.md)", async (t) => {
  const forged = { host: 'shop.example', 'x-forwarded-for': '6.6.6.6', 'x-forwarded-proto': 'http', 'x-forwarded-host': 'evil.example', forwarded: 'for=6.6.6.6', via: '1.1 client-proxy' };
  const out = upstreamRequestHeaders(forged, { remoteAddress: '192.0.2.1', authority: undefined, host: 'shop.example', protocol: '2' }, 'shop.example');
  t.same(
    { xff: out['x-forwarded-for'], xfp: out['x-forwarded-proto'], xfh: out['x-forwarded-host'], fwd: out['forwarded'], via: out['via'] },
    { xff: '192.0.2.1', xfp: 'https', xfh: 'shop.example', fwd: 'for=192.0.2.1;proto=https;host="shop.example"', via: '1.1 client-proxy, 2 edge-proxy' },
  );
  const noHost = upstreamRequestHeaders({ 'x-forwarded-host': 'evil.example' }, { remoteAddress: '::1', authority: undefined, host: undefined, protocol: '3' }, undefined);
  t.equal(noHost['x-forwarded-host'], undefined, 'without a host of its own, the forged one is dropped (undici skips undefined)');
  t.equal(noHost['forwarded'], 'for="[::1]";proto=https');
});
