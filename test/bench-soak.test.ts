// `npm run bench:soak`'s own parts: the command line, the two configurations it alternates
// between (both valid, and B differs from A by a live change only, so every activation makes a new
// generation without a restart), and the HTTP/3 failure count read from gtlsclient's log.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { diffConfigs, loadConfigText } from '@edge-proxy/config';
import { parseSoakArgs, soakConfig } from '../scripts/bench/soak.ts';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { okStreams } from '../scripts/lib/gtlsclient-log.ts';
import { Tally, addCounts } from '../scripts/lib/soak-load.ts';

t.test('parseSoakArgs: the defaults of the issue, bad values refused', async (t) => {
  t.match(parseSoakArgs([]), { minutes: 10, activateEvery: 30, workers: 1, rates: { h1: 300, h2: 300, h3: 100 }, h3Streams: 20, deadlineMs: 5000, json: undefined, printConfig: false });
  t.match(parseSoakArgs(['--minutes', '2', '--activate-every', '20', '--h3-rate', '0']), { minutes: 2, activateEvery: 20, rates: { h3: 0 } });
  for (const bad of [['--minutes', '0'], ['--minutes', '1.5'], ['--activate-every', '0'], ['--h1-rate', '-1'], ['--h3-streams', '101'], ['--workers', 'two'], ['--nope']]) {
    t.throws(() => parseSoakArgs(bad), `${bad.join(' ')} refused`);
  }
});

t.test('soakConfig: A and B validate; B adds an upstream and nothing that needs a restart', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'bench-soak-test-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const leaf = makeLeaf(dir, 'server', makeCa(dir), { sans: ['localhost', '127.0.0.1'] });
  const vars = { ports: { l: 20001, c: 20002, m: 20003 }, cert: leaf.cert, key: leaf.key, backendPort: 20011, workers: 2 };
  const a = await loadConfigText(soakConfig(vars, 'A'), dir);
  const b = await loadConfigText(soakConfig(vars, 'B'), dir);
  t.ok(a.ok, a.ok ? 'A valid' : JSON.stringify(a.issues));
  t.ok(b.ok, b.ok ? 'B valid' : JSON.stringify(b.issues));
  if (!a.ok || !b.ok) return;
  for (const [from, to] of [[a.value, b.value], [b.value, a.value]] as const) {
    const d = diffConfigs(from, to);
    t.ok(d.changed, 'a change');
    t.notOk(d.restart_required, 'activatable live');
    t.same(d.rejected_changes, []);
    t.same(Object.keys(d.domains), ['upstreams'], 'the upstream soak_alt (with its route) is the whole change');
  }
});

t.test('okStreams: streams with a 2xx that closed with H3_NO_ERROR; others are failures', async (t) => {
  const log = [
    'http: stream 0x0 [:status: 200]',
    'HTTP stream 0 closed with error code 256',
    'http: stream 0x4 [:status: 503]',
    'HTTP stream 4 closed with error code 256',
    'http: stream 0x8 [:status: 200]',
    'HTTP stream 8 closed with error code 268',
    'http: stream 0xc [:status: 204]',
    'HTTP stream 12 closed with error code 256',
    'http: stream 0x10 [:status: 200]',
  ].join('\n');
  // 0x0 and 0xc (decimal 12) complete; 0x4 a 503, 0x8 reset (H3_REQUEST_CANCELLED), 0x10 never closed.
  t.equal(okStreams(log), 2);
  t.equal(okStreams(''), 0);
});

t.test('Tally: counts since the last take, failures by reason', async (t) => {
  const tally = new Tally();
  tally.addSent(3);
  tally.addEnded(undefined, 2);
  tally.addEnded('deadline');
  t.same(tally.take(), { sent: 3, ok: 2, failed: 1, failures: { deadline: 1 } });
  t.same(tally.take(), { sent: 0, ok: 0, failed: 0, failures: {} });
});

t.test('addCounts: the sum of two tallies, failures merged by reason, neither input changed', async (t) => {
  const a = { sent: 3, ok: 2, failed: 1, failures: { deadline: 1 } };
  const b = { sent: 5, ok: 2, failed: 3, failures: { deadline: 2, '503': 1 } };
  t.same(addCounts(a, b), { sent: 8, ok: 4, failed: 4, failures: { deadline: 3, '503': 1 } });
  t.same(a.failures, { deadline: 1 }, 'the first input is not changed');
});
