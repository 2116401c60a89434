// Malformed requests and protocol violations sent over raw streams: each gets the H3 code
// RFC 9114 / RFC 9204 prescribe, on the stream (RESET_STREAM) or on the connection
// (CONNECTION_CLOSE); the server keeps serving and releases everything afterwards.
import { once } from 'node:events';
import t from 'tap';
import type { Test } from 'tap';
import {
  QpackEncoder,
  encodeDataFrameHeader,
  encodeFrame,
  encodeFrameHeader,
  encodeGoawayFrame,
  encodeHeadersFrame,
  encodeSettingsFrame,
  encodeCancelPushFrame,
} from '../src/index.ts';
import type { H3Error, Header, Http3ClientSession, Http3Server } from '../src/index.ts';
import { assertNothingHeld, connect, makePki, startServer } from './net-helpers.ts';

const pki = makePki(t);

const REQUEST: Header[] = [
  [':method', 'POST'],
  [':scheme', 'https'],
  [':authority', 'localhost'],
  [':path', '/'],
];
const head = (lines: Header[]): Buffer => Buffer.from(encodeHeadersFrame(new QpackEncoder().encodeFieldSection(0, lines)));
const data = (text: string): Buffer => Buffer.concat([encodeDataFrameHeader(text.length), Buffer.from(text)]);

async function serve(t: Test): Promise<{ server: Http3Server; port: number; protocolErrors: string[] }> {
  const { server, port } = await startServer(t, pki);
  const protocolErrors: string[] = [];
  server.on('protocolError', (err: H3Error) => protocolErrors.push(err.code));
  server.on('request', (req, res) => {
    req.resume();
    req.on('end', () => res.end('ok'));
  });
  return { server, port, protocolErrors };
}

t.test('malformed requests: the stream is reset, the connection lives on', async (t) => {
  const { server, port } = await serve(t);
  const client = await connect(t, pki, port);
  const cases: Array<[string, Buffer, number]> = [
    ['missing :path', head(REQUEST.filter(([n]) => n !== ':path')), 0x10e],
    ['uppercase field name', head([...REQUEST, ['X-Upper', '1']]), 0x10e],
    ['connection-specific field', head([...REQUEST, ['connection', 'keep-alive']]), 0x10e],
    ['te other than trailers', head([...REQUEST, ['te', 'gzip']]), 0x10e],
    ['pseudo-header after a regular field', head([[':method', 'GET'], ['accept', '*/*'], [':scheme', 'https'], [':authority', 'a'], [':path', '/']]), 0x10e],
    ['unknown pseudo-header', head([...REQUEST, [':protocol', 'websocket']]), 0x10e],
    ['body shorter than content-length', Buffer.concat([head([...REQUEST, ['content-length', '10']]), data('12345')]), 0x10e],
    ['body longer than content-length', Buffer.concat([head([...REQUEST, ['content-length', '2']]), data('12345')]), 0x10e],
    ['trailers with a pseudo-header', Buffer.concat([head(REQUEST), data('x'), head([[':path', '/']])]), 0x10e],
    ['FIN before HEADERS', Buffer.alloc(0), 0x10d],
  ];
  for (const [name, bytes, code] of cases) {
    const raw = await client.openRawStream('bidi');
    if (bytes.length > 0) await raw.write(bytes);
    await raw.end();
    const result = await raw.readAll();
    t.equal(result.resetCode, code, `${name}: RESET_STREAM 0x${code.toString(16)}`);
  }
  const ok = await client.fetch({});
  t.equal(ok.body.toString(), 'ok', 'the connection still serves requests');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('a request head over the field-section limit gets 431', async (t) => {
  const { server, port } = await startServer(t, pki, { maxFieldSectionSize: 1024 });
  const client = await connect(t, pki, port);
  const raw = await client.openRawStream('bidi');
  await raw.write(head([...REQUEST, ['x-big', 'b'.repeat(4000)]]));
  await raw.end();
  const result = await raw.readAll();
  t.ok(result.fin, 'a complete response, not a reset');
  t.match(result.data.toString('latin1'), /431/, 'status 431 in the response head');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('a request head that never completes is reset after requestHeadTimeoutMs', async (t) => {
  const { server, port } = await startServer(t, pki, { requestHeadTimeoutMs: 200 });
  const client = await connect(t, pki, port);
  const half = await client.openRawStream('bidi');
  await half.write(head(REQUEST).subarray(0, 4));
  const blocked = await client.openRawStream('bidi');
  // Required Insert Count 1 while nothing is ever inserted: blocked for good.
  await blocked.write(Buffer.from(encodeFrame(0x01, Buffer.from([0x02, 0x00, 0x80]))));
  const [a, b] = await Promise.all([half.readAll(), blocked.readAll()]);
  t.equal(a.resetCode, 0x10c, 'half a HEADERS frame: reset with H3_REQUEST_CANCELLED');
  t.equal(b.resetCode, 0x10c, 'a head blocked on QPACK: reset too');
  t.equal(server.stats().requestStreams, 0, 'both streams released while the connection lives');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('ignored: reserved frame types on a request stream, unknown unidirectional stream types', async (t) => {
  const { server, port } = await serve(t);
  const client = await connect(t, pki, port);
  const grease = await client.openRawStream('uni');
  await grease.write(Buffer.from([0x40, 0x21, 1, 2, 3])); // reserved stream type 0x21 (RFC 9114 §6.2.3)
  const raw = await client.openRawStream('bidi');
  await raw.write(Buffer.concat([encodeFrame(0x21, Buffer.from('grease')), head(REQUEST), encodeFrame(0x1f * 7 + 0x21, Buffer.alloc(3)), data('body')]));
  await raw.end();
  const result = await raw.readAll();
  t.ok(result.fin, 'the request was answered');
  t.match(result.data.toString('latin1'), /ok$/);
  await client.close();
  await assertNothingHeld(t, server);
});

// Each case: what to send on a fresh connection, and the code of the CONNECTION_CLOSE.
interface ConnectionCase {
  name: string;
  code: number;
  manualControl?: boolean;
  act(client: Http3ClientSession): Promise<void>;
}

async function sendRaw(client: Http3ClientSession, kind: 'bidi' | 'uni', bytes: Buffer, fin = true): Promise<void> {
  const raw = await client.openRawStream(kind);
  await raw.write(bytes).catch(() => {});
  if (fin) await raw.end();
}

const controlPrefix = (frames: Buffer[]): Buffer => Buffer.concat([Buffer.from([0x00]), ...frames]);

const CONNECTION_CASES: ConnectionCase[] = [
  { name: 'DATA before HEADERS', code: 0x105, act: (c) => sendRaw(c, 'bidi', data('early')) },
  { name: 'an HTTP/2 frame type (PRIORITY 0x02) on a request stream', code: 0x105, act: (c) => sendRaw(c, 'bidi', Buffer.concat([head(REQUEST), encodeFrame(0x02, Buffer.alloc(2))])) },
  { name: 'SETTINGS on a request stream', code: 0x105, act: (c) => sendRaw(c, 'bidi', Buffer.from(encodeSettingsFrame({}))) },
  { name: 'a frame truncated by FIN', code: 0x106, act: (c) => sendRaw(c, 'bidi', Buffer.concat([Buffer.from(encodeFrameHeader(0x01, 10)), Buffer.from([0, 0, 0])])) },
  { name: 'an undecodable QPACK field section', code: 0x200, act: (c) => sendRaw(c, 'bidi', Buffer.from(encodeFrame(0x01, Buffer.from([0x00, 0x00, 0xff, 0xff, 0xff])))) },
  { name: 'a second control stream', code: 0x103, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeSettingsFrame({}))]), false) },
  { name: 'a push stream from the client', code: 0x103, act: (c) => sendRaw(c, 'uni', Buffer.from([0x01, 0x00]), false) },
  { name: 'a control stream not starting with SETTINGS', code: 0x10a, manualControl: true, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeGoawayFrame(0))]), false) },
  { name: 'closing the control stream', code: 0x104, manualControl: true, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeSettingsFrame({}))]), true) },
  { name: 'duplicate setting identifiers', code: 0x109, manualControl: true, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeFrame(0x04, Buffer.from([0x06, 0x10, 0x06, 0x20])))]), false) },
  { name: 'an HTTP/2 setting identifier', code: 0x109, manualControl: true, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeFrame(0x04, Buffer.from([0x02, 0x00])))]), false) },
  { name: 'DATA on the control stream', code: 0x105, manualControl: true, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeSettingsFrame({})), data('x')]), false) },
  { name: 'GOAWAY IDs increasing', code: 0x108, manualControl: true, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeSettingsFrame({})), Buffer.from(encodeGoawayFrame(4)), Buffer.from(encodeGoawayFrame(8))]), false) },
  { name: 'CANCEL_PUSH for a push never promised', code: 0x108, manualControl: true, act: (c) => sendRaw(c, 'uni', controlPrefix([Buffer.from(encodeSettingsFrame({})), Buffer.from(encodeCancelPushFrame(0))]), false) },
  { name: 'a second QPACK encoder stream', code: 0x103, act: (c) => sendRaw(c, 'uni', Buffer.from([0x02]), false) },
  { name: 'QPACK table capacity above the advertised maximum', code: 0x201, manualControl: true, act: (c) => sendRaw(c, 'uni', Buffer.from([0x02, 0x3f, 0xe1, 0xff, 0x03]), false) },
  { name: 'an invalid QPACK decoder instruction (Insert Count Increment 0)', code: 0x202, manualControl: true, act: (c) => sendRaw(c, 'uni', Buffer.from([0x03, 0x00]), false) },
];

t.test('protocol violations close the connection with the right code', async (t) => {
  const { server, port, protocolErrors } = await serve(t);
  for (const c of CONNECTION_CASES) {
    const client = await connect(t, pki, port, { manualControlStreams: c.manualControl === true });
    const closed = once(client, 'close');
    await c.act(client);
    const [info] = (await closed) as [{ by: string; code: number; isApp: boolean }];
    t.match(info, { by: 'peer', code: c.code, isApp: true }, `${c.name}: CONNECTION_CLOSE 0x${c.code.toString(16)}`);
  }
  t.equal(protocolErrors.length, CONNECTION_CASES.length, 'each violation was reported once as protocolError');
  const client = await connect(t, pki, port);
  t.equal((await client.fetch({})).body.toString(), 'ok', 'the server still serves new connections');
  await client.close();
  await assertNothingHeld(t, server);
});
