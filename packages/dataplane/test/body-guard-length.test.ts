// BodyGuard's content-length framing (proxy/body-guard.ts): the chunk that completes the declared
// length is held until the client's stream ends, a body that disagrees with the length is refused
// with EDGE_REQUEST_BODY_LENGTH_MISMATCH, and `resetForLength` reads the protocol layers' resets.
import t from 'tap';
import { PassThrough, Readable } from 'node:stream';
import { constants as h2 } from 'node:http2';
import { BodyGuard, resetForLength } from '../src/proxy/body-guard.ts';

const TIMEOUTS = { idleMs: 60_000, totalMs: 60_000, minBytesPerSec: 0 };

/** A guard for `declared` bytes fed from a PassThrough; what it emitted so far, and its end or error. */
function guarded(declared: number): { src: PassThrough; guard: BodyGuard; out: Buffer[]; settled: Promise<string> } {
  const src = new PassThrough();
  const guard = new BodyGuard(0, TIMEOUTS, declared, src);
  const out: Buffer[] = [];
  guard.on('data', (c: Buffer) => out.push(c));
  const settled = new Promise<string>((resolve) => {
    guard.on('end', () => resolve('end'));
    guard.on('error', (e: Error & { code?: string }) => resolve(String(e.code)));
  });
  src.pipe(guard);
  return { src, guard, out, settled };
}

/** Lets the streams move every chunk written so far. */
const drain = (): Promise<void> => new Promise((r) => setImmediate(r));

t.test('the chunk that completes the declared length is held until the end, then passed on as it came', async (t) => {
  const g = guarded(10);
  const last = Buffer.from('67890');
  g.src.write(Buffer.from('12345'));
  g.src.write(last);
  await drain();
  t.same(Buffer.concat(g.out).toString(), '12345', 'before the end: 5 of 10 bytes passed on, the completing chunk held');
  g.src.end();
  t.equal(await g.settled, 'end');
  t.same(Buffer.concat(g.out).toString(), '1234567890', 'at the end: the whole body');
  t.equal(g.out[1], last, 'the held chunk is the same Buffer (no copy)');
  t.equal(g.guard.lengthMismatch, false);
});

t.test('table: bodies against their declared length', async (t) => {
  const cases: Array<{ name: string; declared: number; chunks: string[]; settled: string; out: string }> = [
    { name: 'exact, one chunk', declared: 3, chunks: ['abc'], settled: 'end', out: 'abc' },
    { name: 'exact, three chunks', declared: 3, chunks: ['a', 'b', 'c'], settled: 'end', out: 'abc' },
    { name: 'no content-length: streamed as it comes', declared: NaN, chunks: ['a', 'bcdef'], settled: 'end', out: 'abcdef' },
    { name: 'longer in one chunk', declared: 3, chunks: ['abcd'], settled: 'EDGE_REQUEST_BODY_LENGTH_MISMATCH', out: '' },
    { name: 'longer after the completing chunk', declared: 3, chunks: ['abc', 'd'], settled: 'EDGE_REQUEST_BODY_LENGTH_MISMATCH', out: '' },
    { name: 'shorter, then the end', declared: 5, chunks: ['ab', 'c'], settled: 'EDGE_REQUEST_BODY_LENGTH_MISMATCH', out: 'abc' },
  ];
  for (const c of cases) {
    const g = guarded(c.declared);
    for (const chunk of c.chunks) g.src.write(Buffer.from(chunk));
    g.src.end();
    t.equal(await g.settled, c.settled, `${c.name}: ${c.settled}`);
    t.equal(Buffer.concat(g.out).toString(), c.out, `${c.name}: passed on ${JSON.stringify(c.out)}`);
    t.equal(g.guard.lengthMismatch, c.settled !== 'end', `${c.name}: lengthMismatch`);
  }
});

t.test('a source reset by its protocol layer: the held chunk is never passed on, and the reset is read as a length mismatch', async (t) => {
  const g = guarded(4);
  g.src.on('error', () => undefined);
  g.src.write(Buffer.from('ab'));
  g.src.write(Buffer.from('cd'));
  await drain();
  g.src.destroy(Object.assign(new Error('body exceeds content-length 4'), { code: 'EDGE_H3_CONTENT_LENGTH_MISMATCH' }));
  await drain();
  t.equal(Buffer.concat(g.out).toString(), 'ab', 'the completing chunk was never passed on');
  t.equal(g.guard.lengthMismatch, true);
  g.guard.destroy();
});

t.test('resetForLength: which resets mean a body that disagrees with its content-length', async (t) => {
  const reset = (o: { errored?: object; rstCode?: number; ended?: boolean }): Readable => {
    const r = new Readable({ read() {} });
    if (o.errored !== undefined) {
      r.on('error', () => undefined);
      r.destroy(o.errored as Error);
    }
    if (o.rstCode !== undefined) Object.assign(r, { rstCode: o.rstCode });
    if (o.ended === true) Object.defineProperty(r, 'readableEnded', { value: true });
    return r;
  };
  const rows: Array<[string, Readable, number, boolean]> = [
    ['HTTP/3 EDGE_H3_CONTENT_LENGTH_MISMATCH', reset({ errored: { code: 'EDGE_H3_CONTENT_LENGTH_MISMATCH' } }), 10, true],
    ['HTTP/3 client cancel', reset({ errored: { code: 'H3_REQUEST_CANCELLED' } }), 10, false],
    ['HTTP/2 RST_STREAM PROTOCOL_ERROR (short body)', reset({ rstCode: h2.NGHTTP2_PROTOCOL_ERROR }), 10, true],
    ['HTTP/2 session protocol error (longer body)', reset({ errored: { code: 'ERR_HTTP2_ERROR', errno: -505 }, rstCode: h2.NGHTTP2_INTERNAL_ERROR }), 10, true],
    ['HTTP/2 client CANCEL', reset({ rstCode: h2.NGHTTP2_CANCEL }), 10, false],
    ['HTTP/2 PROTOCOL_ERROR without a content-length', reset({ rstCode: h2.NGHTTP2_PROTOCOL_ERROR }), NaN, false],
    ['a body that ended', reset({ rstCode: h2.NGHTTP2_PROTOCOL_ERROR, ended: true }), 10, false],
  ];
  for (const [name, source, declared, want] of rows) t.equal(resetForLength(source, declared), want, name);
});
