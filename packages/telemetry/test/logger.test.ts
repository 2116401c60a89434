// The service logger's line shapes: string levels, ISO-8601 time, who wrote the line, the plain
// format, and the journal conventions (sd-daemon(3) `<N>` prefixes; plain lines without a time).
import t from 'tap';
import { Writable } from 'node:stream';
import { closeSync, fstatSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createLogger } from '../src/logger.ts';
import type { LoggerOptions } from '../src/logger.ts';
import { isJournalStream, syslogPrefix } from '../src/journal.ts';

/** A logger writing into an array of lines. */
function capture(o: Omit<LoggerOptions, 'destination'>): { lines: string[]; log: ReturnType<typeof createLogger> } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l.length > 0) lines.push(l);
      cb();
    },
  });
  return { lines, log: createLogger({ ...o, destination: sink }) };
}

const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

t.test('JSON: the level as its label, an ISO-8601 time, the fields of the process on every line', async (t) => {
  const { lines, log } = capture({ level: 'debug', format: 'json', fields: { role: 'worker', worker: 3 } });
  log.debug('d');
  log.info({ upstream: 'api' }, 'i');
  log.warn('w');
  log.error('e');
  const parsed = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  t.same(parsed.map((p) => p['level']), ['debug', 'info', 'warn', 'error']);
  for (const p of parsed) {
    t.match(p['time'], ISO);
    t.equal(p['pid'], process.pid);
    t.equal(p['role'], 'worker');
    t.equal(p['worker'], 3);
  }
  t.equal(parsed[1]?.['upstream'], 'api');
  t.ok(lines.every((l) => l.startsWith('{"level":"')), 'the level leads every line');
});

t.test('plain: time LEVEL [who] msg key=value', async (t) => {
  const w = capture({ level: 'info', format: 'plain', fields: { role: 'worker', worker: 1 } });
  w.log.warn({ upstream: 'api', code: 'transport', note: 'two words' }, 'upstream failure answered with 502');
  const [line] = w.lines;
  const m = /^(\S+) WARN \[worker 1\] upstream failure answered with 502 upstream=api code=transport note="two words"$/.exec(line ?? '');
  t.ok(m !== null, line ?? 'no line');
  t.match(m?.[1], ISO);
  const s = capture({ level: 'info', format: 'plain', fields: { role: 'supervisor' } });
  s.log.info({ worker: 0, code: 0 }, 'worker exited');
  t.match(s.lines[0], /^\S+ INFO \[supervisor\] worker exited worker=0 code=0$/, 'a supervisor line about a worker keeps the worker field');
});

t.test('journal: `<N>` priority prefixes; plain lines leave the time to journald; JSON stays JSON after the prefix', async (t) => {
  const plain = capture({ level: 'trace', format: 'plain', fields: { role: 'supervisor' }, journal: true });
  plain.log.trace('t');
  plain.log.debug('d');
  plain.log.info('i');
  plain.log.warn('w');
  plain.log.error('e');
  plain.log.fatal('f');
  t.same(plain.lines, ['<7>TRACE [supervisor] t', '<7>DEBUG [supervisor] d', '<6>INFO [supervisor] i', '<4>WARN [supervisor] w', '<3>ERROR [supervisor] e', '<2>FATAL [supervisor] f']);
  const json = capture({ level: 'info', format: 'json', journal: true });
  json.log.info('i');
  json.log.warn({ a: 1 }, 'w');
  json.log.error('e');
  t.same(json.lines.map((l) => l.slice(0, 3)), ['<6>', '<4>', '<3>']);
  const body = JSON.parse((json.lines[1] as string).slice(3)) as Record<string, unknown>;
  t.match(body, { level: 'warn', a: 1, msg: 'w' }, 'what journald stores (the prefix stripped) is the JSON line');
  t.match(body['time'], ISO);
  t.equal(syslogPrefix('nonsense'), '<6>');
});

t.test('isJournalStream: JOURNAL_STREAM must name the device and inode of the descriptor', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'edge-journal-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const fd = openSync(path.join(dir, 'out'), 'a');
  const other = openSync(path.join(dir, 'other'), 'a');
  t.teardown(() => {
    closeSync(fd);
    closeSync(other);
  });
  const st = fstatSync(fd, { bigint: true });
  const named = `${st.dev}:${st.ino}`;
  t.equal(isJournalStream({ JOURNAL_STREAM: named }, fd), true, 'the stream systemd named');
  t.equal(isJournalStream({ JOURNAL_STREAM: named }, other), false, 'another file (stdout redirected by a child) is not the journal');
  t.equal(isJournalStream({}, fd), false, 'unset');
  t.equal(isJournalStream({ JOURNAL_STREAM: 'garbage' }, fd), false, 'malformed');
  t.equal(isJournalStream({ JOURNAL_STREAM: `${st.dev}:${st.ino + 1n}` }, fd), false, 'another inode');
});
