// Hop-by-hop removal (RFC 9110 §7.6.1) for every shape of `Connection`: the common single tokens
// take a shortcut, lists and repeated fields are parsed, and only the fields they name go.
import t from 'tap';
import { endToEnd } from '../src/upstream/headers.ts';

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
