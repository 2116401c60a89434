// The throttled log of answered 502s and 504s, with a fake clock: the first failure of a kind is
// written at once, the rest of an interval is one line with a `suppressed` count, quiet kinds are
// forgotten, and every failure is accounted for by exactly one line.
import t from 'tap';
import { Writable } from 'node:stream';
import { createLogger } from '@edge-proxy/telemetry';
import { UpstreamFailureLog } from '../src/proxy/failure-log.ts';
import type { UpstreamFailure } from '../src/proxy/failure-log.ts';

function setup(): { lines: Record<string, unknown>[]; log: UpstreamFailureLog; clock: { now: number } } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l.length > 0) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  const clock = { now: 0 };
  const log = new UpstreamFailureLog(createLogger({ level: 'info', format: 'json', destination: sink }), 1000, () => clock.now);
  t.teardown(() => log.close());
  return { lines, log, clock };
}

const failure = (backend: string, code: string, durationMs = 3.4): UpstreamFailure => ({ upstream: 'api', backend, status: code.endsWith('timeout') ? 504 : 502, code, durationMs, generation: 2, requestId: `r-${backend}-${code}` });
const summary = (l: Record<string, unknown>): unknown[] => [l['backend'], l['code'], l['status'], l['suppressed']];

t.test('a flood of one kind: one line at once, then one per interval with the count', async (t) => {
  const { lines, log, clock } = setup();
  for (let i = 0; i < 100; i++) log.note(failure('b1', 'transport'));
  t.equal(lines.length, 1, 'one line for 100 failures in the same instant');
  t.match(lines[0], { level: 'warn', msg: 'upstream failure answered with 502', upstream: 'api', backend: 'b1', status: 502, code: 'transport', duration_ms: 3, generation: 2, request_id: 'r-b1-transport', suppressed: 0 });
  clock.now = 999;
  log.tick();
  t.equal(lines.length, 1, 'nothing before the interval is over');
  clock.now = 1000;
  log.tick();
  t.same(lines.map(summary), [['b1', 'transport', 502, 0], ['b1', 'transport', 502, 98]], 'the second line describes the last failure and the 98 between');
  log.note(failure('b1', 'transport'));
  clock.now = 2000;
  log.tick();
  t.same(summary(lines[2] ?? {}), ['b1', 'transport', 502, 0], 'one more failure in the next interval: its own line at the interval end');
  clock.now = 3000;
  log.tick();
  t.equal(lines.length, 3, 'a quiet interval writes nothing');
  log.note(failure('b1', 'transport'));
  t.equal(lines.length, 4, 'and after it the kind is forgotten: the next failure is written at once');
  const accounted = lines.reduce((s, l) => s + 1 + Number(l['suppressed']), 0);
  t.equal(accounted, 102, 'every failure is one line or counted in one');
});

t.test('kinds are (upstream, backend, code): each has its own line', async (t) => {
  const { lines, log } = setup();
  log.note(failure('b1', 'transport'));
  log.note(failure('b1', 'connect_timeout'));
  log.note(failure('b2', 'transport'));
  log.note({ ...failure('b1', 'transport'), upstream: 'web' });
  log.note(failure('b1', 'transport'));
  t.same(lines.map((l) => [l['upstream'], ...summary(l)]), [
    ['api', 'b1', 'transport', 502, 0],
    ['api', 'b1', 'connect_timeout', 504, 0],
    ['api', 'b2', 'transport', 502, 0],
    ['web', 'b1', 'transport', 502, 0],
  ]);
});

t.test('close writes the counts not written yet', async (t) => {
  const { lines, log } = setup();
  for (let i = 0; i < 5; i++) log.note(failure('b1', 'headers_timeout'));
  log.close();
  t.same(lines.map(summary), [['b1', 'headers_timeout', 504, 0], ['b1', 'headers_timeout', 504, 3]]);
});
