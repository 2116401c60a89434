// The access log's line (proxy/access-log.ts) through a real pino logger, and request ids
// (proxy/request-id.ts): which requests are kept under sampling, what a line holds, what it never
// holds, and which incoming ids are kept.
import t from 'tap';
import { Writable } from 'node:stream';
import { createLogger } from '@edge-proxy/telemetry';
import type { Logger, RequestFacts } from '@edge-proxy/telemetry';
import { AccessLog, FIELD_MAX } from '../src/proxy/access-log.ts';
import type { AccessEntry } from '../src/proxy/access-log.ts';
import { acceptableRequestId, requestIdOf } from '../src/proxy/request-id.ts';

function capture(level: 'info' | 'warn' = 'info'): { lines: Record<string, unknown>[]; log: ReturnType<typeof createLogger> } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l.length > 0) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { lines, log: createLogger({ level, format: 'json', destination: sink }) };
}

const facts = (o: Partial<RequestFacts> = {}): RequestFacts => ({ status: 200, outcome: 'success', code: undefined, reason: undefined, failureClass: undefined, upstream: 'api', backend: 'api-1', attempts: 1, bytesIn: 10, bytesOut: 20, durationMs: 1.23456, ...o });
const entry = (o: Partial<AccessEntry> = {}): AccessEntry => ({ requestId: 'r-1', traceId: undefined, listener: 'main', protocol: '2', method: 'GET', authority: 'example.com', path: '/a/b?token=secret', generation: 3, validated: true, ...o });

t.test('sampling: the draw decides for successes; failures are kept while log_failures is on', async (t) => {
  const cases: Array<[string, RequestFacts, number, boolean, number, boolean]> = [
    ['ratio 1 keeps every request', facts(), 1, true, 0.999, true],
    ['ratio 0 drops a success', facts(), 0, true, 0, false],
    ['a draw under the ratio keeps', facts(), 0.1, true, 0.05, true],
    ['a draw over the ratio drops', facts(), 0.1, true, 0.5, false],
    ['ratio 0 keeps a 502 (log_failures)', facts({ status: 502, outcome: 'failure' }), 0, true, 0.9, true],
    ['ratio 0 keeps a request never answered', facts({ status: 0, outcome: 'failure' }), 0, true, 0.9, true],
    ['ratio 0 drops a 429 (not a failure of the service)', facts({ status: 429, outcome: 'rate_limited' }), 0, true, 0.9, false],
    ['log_failures false: a 502 takes the draw like any request', facts({ status: 502 }), 0, false, 0, false],
  ];
  for (const [what, f, ratio, failures, draw, kept] of cases) t.equal(AccessLog.keeps(f, ratio, failures, draw), kept, what);
});

t.test('a line: every field, at info whatever log.level says, the query string cut off', async (t) => {
  const { lines, log } = capture('warn');
  new AccessLog(log).write(entry({ traceId: '4bf92f3577b34da6a3ce929d0e0e4736' }), facts({ status: 503, outcome: 'overload_shed', code: 'EDGE_SHED_QUEUE_FULL', reason: 'queue_full', failureClass: 'overload' }));
  log.info('not written at warn');
  t.equal(lines.length, 1, 'one line (the access log ignores log.level; the service line at info does not)');
  t.match(lines[0], {
    level: 'info',
    msg: 'access',
    log_type: 'access',
    request_id: 'r-1',
    trace_id: '4bf92f3577b34da6a3ce929d0e0e4736',
    generation: 3,
    listener: 'main',
    protocol: '2',
    method: 'GET',
    authority: 'example.com',
    path: '/a/b',
    status: 503,
    bytes_in: 10,
    bytes_out: 20,
    duration_ms: 1.235,
    upstream: 'api',
    backend: 'api-1',
    attempts: 1,
    outcome: 'overload_shed',
    code: 'EDGE_SHED_QUEUE_FULL',
    reason: 'queue_full',
    failure_class: 'overload',
  });
  t.notOk(JSON.stringify(lines).includes('secret'), 'the query string is never written');
});

t.test('hostile input: long fields are cut, control characters of an unvalidated request escaped', async (t) => {
  const { lines, log } = capture();
  const al = new AccessLog(log);
  al.write(entry({ path: `/${'p'.repeat(5000)}`, authority: 'h'.repeat(5000) }), facts());
  al.write(entry({ path: '/x\u001b[31m\r\nfake line', method: 'G\u0000T', authority: 'a\u007fb', validated: false }), facts({ status: 400 }));
  const [long, hostile] = lines as [Record<string, unknown>, Record<string, unknown>];
  t.equal((long['path'] as string).length, FIELD_MAX + 1, `the path is cut to ${FIELD_MAX} characters (and an ellipsis)`);
  t.equal((long['authority'] as string).length, FIELD_MAX + 1, 'so is the authority');
  t.equal(hostile['path'], '/x\\x1b[31m\\x0d\\x0afake line', 'control characters escaped as \\xNN');
  t.same([hostile['method'], hostile['authority']], ['G\\x00T', 'a\\x7fb'], 'in the method and authority too');
  t.equal(lines.length, 2, 'no line was split');
});

t.test('a logger that throws does not throw into the request path', async (t) => {
  const throwing = { child: () => ({ info: () => { throw new Error('EIO'); } }) } as unknown as Logger;
  t.doesNotThrow(() => new AccessLog(throwing).write(entry(), facts()));
});

t.test('request ids: which incoming ids are kept', async (t) => {
  const kept = ['a', 'A-z_0.9:+/=@', 'x'.repeat(128), '0b5c2f52-3f0e-4c3c-9d0c-51a2a3f1f6a4'];
  const refused: Array<string | string[] | undefined> = [undefined, '', 'x'.repeat(129), 'has space', 'quote"', 'semi;colon', 'tab\t', 'nl\n', 'é', ['a', 'b'], '<script>'];
  for (const v of kept) t.ok(acceptableRequestId(v), `kept: ${v.slice(0, 40)}`);
  for (const v of refused) t.notOk(acceptableRequestId(v), `refused: ${JSON.stringify(v)?.slice(0, 40)}`);
  t.equal(requestIdOf('abc', true), 'abc', 'accept_incoming: a well-formed id is the request\'s');
  t.match(requestIdOf('abc', false), /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'accept_incoming false: a UUID instead');
  t.not(requestIdOf(undefined, true), requestIdOf(undefined, true), 'each generated id is new');
});
