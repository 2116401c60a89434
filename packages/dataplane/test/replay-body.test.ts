// The request body kept for replay (proxy/replay-body.ts): a reader gets the client's bytes as
// they arrive; a second reader replays what was kept and then follows the client; a body that
// outgrows its limit, or the worker's bound, stops being kept (memory given back at once) while
// the reader in progress still gets every byte; releasing it stops an upload nobody reads.
import t from 'tap';
import { PassThrough } from 'node:stream';
import type { Readable } from 'node:stream';
import { ReplayBody } from '../src/proxy/replay-body.ts';
import { RetryControl } from '../src/resilience/retry-control.ts';
import { Metrics } from '@edge-proxy/telemetry';

/** Reads `r` to its end (or error). */
async function drain(r: Readable): Promise<{ bytes: Buffer; error?: string }> {
  const chunks: Buffer[] = [];
  try {
    for await (const c of r) chunks.push(c as Buffer);
    return { bytes: Buffer.concat(chunks) };
  } catch (err) {
    return { bytes: Buffer.concat(chunks), error: (err as Error).message };
  }
}

const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

t.test('a retry replays the kept chunks, then follows the client', async (t) => {
  const client = new PassThrough();
  const memory = new RetryControl(new Metrics('worker'));
  const body = new ReplayBody(client, memory, 1000, NaN);
  const first = body.open();
  const got: Buffer[] = [];
  first.on('data', (c: Buffer) => got.push(c));
  client.write('aaaa');
  client.write('bbbb');
  await tick();
  t.equal(Buffer.concat(got).toString(), 'aaaabbbb', 'the first reader got the bytes as they came');
  t.equal(memory.bufferedBytes, 8, 'and they are kept');
  // The first attempt fails before the body is complete.
  first.destroy();
  await tick();
  const second = body.open();
  const rest = drain(second);
  client.write('cccc');
  client.end();
  t.equal((await rest).bytes.toString(), 'aaaabbbbcccc', 'the retry sent every byte, in order');
  t.ok(body.complete, 'the whole body is kept');
  const third = await drain(body.open());
  t.equal(third.bytes.toString(), 'aaaabbbbcccc', 'a complete body can be read again');
  body.release();
  t.equal(memory.bufferedBytes, 0, 'released: the memory is given back');
});

t.test('a body outgrowing its limit stops being kept, and the reader still gets every byte', async (t) => {
  const client = new PassThrough();
  const memory = new RetryControl(new Metrics('worker'));
  const body = new ReplayBody(client, memory, 10, NaN);
  const all = drain(body.open());
  client.write('123456');
  await tick();
  t.ok(body.replayable);
  t.equal(memory.bufferedBytes, 6);
  client.write('7890ab');
  await tick();
  t.notOk(body.replayable, 'past 10 bytes: not replayable');
  t.equal(memory.bufferedBytes, 0, 'its memory given back at once');
  client.end('cd');
  t.equal((await all).bytes.toString(), '1234567890abcd', 'the attempt in progress got the whole body');
});

t.test('a body declared larger than the limit is never kept; the worker bound refuses more', async (t) => {
  const memory = new RetryControl(new Metrics('worker'), 10);
  const declared = new ReplayBody(new PassThrough(), memory, 5, 6);
  t.notOk(declared.replayable, 'declared 6 > 5');
  const a = new PassThrough();
  const b = new PassThrough();
  const bodyA = new ReplayBody(a, memory, 100, NaN);
  const bodyB = new ReplayBody(b, memory, 100, NaN);
  const ra = drain(bodyA.open());
  const rb = drain(bodyB.open());
  a.end('12345678');
  await ra;
  t.equal(memory.bufferedBytes, 8);
  b.end('abcd');
  t.equal((await rb).bytes.toString(), 'abcd', 'streams all the same');
  t.notOk(bodyB.replayable, 'the worker holds 8 of 10: 4 more would pass the bound, so B is not kept');
  t.ok(bodyA.replayable);
  bodyA.release();
  bodyB.release();
  t.equal(memory.bufferedBytes, 0);
});

t.test('the client failing the body fails the reader with its error', async (t) => {
  const client = new PassThrough();
  const body = new ReplayBody(client, new RetryControl(new Metrics('worker')), 100, NaN);
  const r = drain(body.open());
  client.write('abc');
  await tick();
  client.destroy(Object.assign(new Error('too large'), { code: 'EDGE_REQUEST_BODY_TOO_LARGE' }));
  t.same(await r, { bytes: Buffer.from('abc'), error: 'too large' });
});

t.test('released with nobody reading: the upload is stopped', async (t) => {
  const client = new PassThrough();
  const body = new ReplayBody(client, new RetryControl(new Metrics('worker')), 100, NaN);
  const r = body.open();
  r.destroy();
  await tick();
  body.release();
  t.ok(client.destroyed, 'the client stream is destroyed');
});
