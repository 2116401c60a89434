// Hop-by-hop removal (RFC 9110 §7.6.1) for every shape of `Connection`: the common single tokens
// take a shortcut, lists and repeated fields are parsed, and only the fields they name go.
import t from 'tap';
import { endToEnd, isUnderscoreTwin, upstreamRequestHeaders } from '../src/upstream/headers.ts';

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

t.test('underscore twins of forwarding and framing fields are dropped upstream; other underscores pass', async (t) => {
  const client = { remoteAddress: '192.0.2.9', authority: 'a.example', host: undefined, protocol: '1.1' as const };
  // name sent, whether it is dropped
  const table: [string, boolean][] = [
    ['x_forwarded_for', true],
    ['X_Forwarded_For', true],
    ['x-forwarded_proto', true],
    ['x_forwarded-host', true],
    ['x_forwarded_port', true],
    ['x_forwarded_prefix', true],
    ['x_real_ip', true],
    ['X_Real_IP', true],
    ['x_client_ip', true],
    ['true_client_ip', true],
    ['transfer_encoding', true],
    ['Transfer_Encoding', true],
    ['content_length', true],
    ['keep_alive', true],
    ['proxy_authorization', true],
    ['proxy_connection', true],
    ['http2_settings', true],
    ['x_request_id', true],
    ['x__forwarded_for', false],
    ['x_forwardedfor', false],
    ['my_header', false],
    ['x_api_key', false],
    ['_', false],
    ['x-forwarded-for_', true],
  ];
  for (const [name, dropped] of table) {
    const out = upstreamRequestHeaders({ [name]: '6.6.6.6', accept: '*/*' }, client, 'a.example', false, 'rid-1');
    t.equal(name in out, !dropped, `${name}: ${dropped ? 'dropped' : 'kept'}`);
    t.equal(isUnderscoreTwin(name), dropped && name.includes('_'));
    t.equal(out['x-forwarded-for'], '192.0.2.9', `${name}: our x-forwarded-for`);
    t.equal(out['x-request-id'], 'rid-1');
    t.equal(out['accept'], '*/*');
  }
  // A response's fields are not filtered (the rule is about what a client can make a backend believe).
  t.same(Object.keys(endToEnd({ x_forwarded_for: '1' })), ['x_forwarded_for']);
  // The fields a route's authentication read are guarded too (RouteAuth.guarded).
  const guarded = new Set(['x-auth-token']);
  const g = upstreamRequestHeaders({ 'x-auth-token': 'valid', x_auth_token: 'forged', X_Auth_Token: 'forged', x_other: '1' }, client, 'a.example', false, 'rid-1', guarded);
  t.same([g['x-auth-token'], g['x_auth_token'], g['X_Auth_Token'], g['x_other']], ['valid', undefined, undefined, '1']);
  t.equal(upstreamRequestHeaders({ x_auth_token: 'kept' }, client, 'a.example')['x_auth_token'], 'kept', 'not guarded on a route that reads no such field');
  // Upgrade exchanges drop them too.
  t.notOk('x_forwarded_for' in upstreamRequestHeaders({ x_forwarded_for: '6.6.6.6', upgrade: 'websocket', connection: 'upgrade' }, client, 'a.example', true));
});
