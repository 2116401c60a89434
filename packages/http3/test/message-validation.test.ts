// RFC 9114 §4.1.2, §4.2, §4.3: which field sections are well-formed requests, responses and
// trailers. Table-driven, no sockets.
import t from 'tap';
import { validateRequestHeaders, validateResponseHeaders, validateTrailers } from '../src/message-validation.ts';
import { headersObject, rawHeaderList, appendOutgoing } from '../src/header-object.ts';
import type { Header } from '../src/qpack/decoder.ts';
import { errorCodeOf } from './helpers.ts';

const GET: Header[] = [
  [':method', 'GET'],
  [':scheme', 'https'],
  [':authority', 'example.com'],
  [':path', '/'],
];
const without = (name: string): Header[] => GET.filter(([n]) => n !== name);

t.test('well-formed requests', async (t) => {
  const cases: Array<[string, Header[], Partial<ReturnType<typeof validateRequestHeaders>>]> = [
    ['plain GET', GET, { method: 'GET', scheme: 'https', authority: 'example.com', path: '/' }],
    ['host instead of :authority', [...without(':authority'), ['host', 'h.example']], { authority: 'h.example' }],
    ['same :authority and host', [...GET, ['host', 'example.com']], { authority: 'example.com' }],
    ['OPTIONS *', [[':method', 'OPTIONS'], [':scheme', 'https'], [':authority', 'a'], [':path', '*']], { path: '*' }],
    ['CONNECT', [[':method', 'CONNECT'], [':authority', 'a.example:443']], { method: 'CONNECT', scheme: undefined, path: undefined }],
    ['content-length', [...GET, ['content-length', '12']], { contentLength: 12 }],
    ['repeated equal content-length', [...GET, ['content-length', '5'], ['content-length', '5, 5']], { contentLength: 5 }],
    ['te: trailers', [...GET, ['te', 'trailers']], {}],
    ['non-http scheme without authority', [[':method', 'GET'], [':scheme', 'foo'], [':path', 'x']], { authority: '' }],
  ];
  for (const [name, lines, expected] of cases) t.match(validateRequestHeaders(lines), expected, name);
});

t.test('malformed requests are H3_MESSAGE_ERROR stream errors', async (t) => {
  const cases: Array<[string, Header[]]> = [
    ['missing :method', without(':method')],
    ['missing :path', without(':path')],
    ['missing :scheme', without(':scheme')],
    ['empty :path', [...without(':path'), [':path', '']]],
    ['no authority for https', without(':authority')],
    ['path not origin-form', [...without(':path'), [':path', 'index.html']]],
    ['repeated pseudo-header', [...GET, [':path', '/again']]],
    ['unknown pseudo-header', [...GET, [':protocol', 'websocket']]],
    ['response pseudo-header', [[':status', '200'], ...GET]],
    ['pseudo after regular', [[':method', 'GET'], ['accept', '*/*'], [':scheme', 'https'], [':authority', 'a'], [':path', '/']]],
    ['uppercase name', [...GET, ['Accept', '*/*']]],
    ['space in name', [...GET, ['bad name', 'x']]],
    ['empty name', [...GET, ['', 'x']]],
    ['NUL in value', [...GET, ['x', 'a\0b']]],
    ['CR LF in value', [...GET, ['x', 'a\r\nb: c']]],
    ['connection', [...GET, ['connection', 'close']]],
    ['keep-alive', [...GET, ['keep-alive', 'timeout=5']]],
    ['proxy-connection', [...GET, ['proxy-connection', 'keep-alive']]],
    ['transfer-encoding', [...GET, ['transfer-encoding', 'chunked']]],
    ['upgrade', [...GET, ['upgrade', 'websocket']]],
    ['te other than trailers', [...GET, ['te', 'gzip']]],
    [':authority and host differ', [...GET, ['host', 'other.example']]],
    ['non-numeric content-length', [...GET, ['content-length', '12a']]],
    ['negative content-length', [...GET, ['content-length', '-1']]],
    ['conflicting content-length', [...GET, ['content-length', '1'], ['content-length', '2']]],
    ['CONNECT with :path', [[':method', 'CONNECT'], [':authority', 'a:1'], [':path', '/']]],
    ['CONNECT without :authority', [[':method', 'CONNECT'], ['host', 'a:1']]],
    ['method with a space', [...without(':method'), [':method', 'G T']]],
  ];
  for (const [name, lines] of cases) {
    t.equal(errorCodeOf(() => validateRequestHeaders(lines)), 'H3_MESSAGE_ERROR', name);
    try {
      validateRequestHeaders(lines);
    } catch (err) {
      t.equal((err as { scope: string }).scope, 'stream', `${name}: stream scope`);
    }
  }
});

t.test('responses', async (t) => {
  t.match(validateResponseHeaders([[':status', '204']]), { status: 204, contentLength: undefined });
  t.match(validateResponseHeaders([[':status', '200'], ['content-length', '3']]), { status: 200, contentLength: 3 });
  t.match(validateResponseHeaders([[':status', '103'], ['link', '</a>; rel=preload']]), { status: 103 });
  const bad: Array<[string, Header[]]> = [
    ['no :status', [['content-type', 'text/plain']]],
    ['two :status', [[':status', '200'], [':status', '200']]],
    ['non-numeric', [[':status', '2xx']]],
    ['out of range', [[':status', '600']]],
    ['101', [[':status', '101']]],
    ['request pseudo', [[':status', '200'], [':path', '/']]],
    ['connection-specific', [[':status', '200'], ['transfer-encoding', 'chunked']]],
  ];
  for (const [name, lines] of bad) t.equal(errorCodeOf(() => validateResponseHeaders(lines)), 'H3_MESSAGE_ERROR', name);
});

t.test('trailers', async (t) => {
  t.equal(errorCodeOf(() => validateTrailers([['x-checksum', 'abc']])), 'no error');
  t.equal(errorCodeOf(() => validateTrailers([[':status', '200']])), 'H3_MESSAGE_ERROR', 'pseudo-header in trailers');
  t.equal(errorCodeOf(() => validateTrailers([['X-Upper', '1']])), 'H3_MESSAGE_ERROR', 'uppercase in trailers');
});

t.test('header objects follow Node http2 conventions', async (t) => {
  const lines: Header[] = [...GET, ['cookie', 'a=1'], ['cookie', 'b=2'], ['set-cookie', 'x'], ['accept', 'a'], ['accept', 'b']];
  const obj = headersObject(lines);
  t.equal(obj[':method'], 'GET', 'pseudo-headers included');
  t.equal(obj['cookie'], 'a=1; b=2', 'cookies join with "; " (RFC 9114 §4.2.1)');
  t.same(obj['set-cookie'], ['x'], 'set-cookie stays a list');
  t.equal(obj['accept'], 'a, b', 'other repeats join with ", "');
  t.equal(rawHeaderList([['a', '1']]).join(','), 'a,1');
  t.same(appendOutgoing([], { 'X-Num': 5, 'x-list': ['a', 'b'], connection: 'close', te: 'gzip', skip: undefined }), [
    ['x-num', '5'],
    ['x-list', 'a'],
    ['x-list', 'b'],
  ], 'lowercased, lists expanded, connection-specific fields dropped');
  t.equal(errorCodeOf(() => appendOutgoing([], { 'bad name': 'x' })), 'EDGE_H3_INVALID_USE');
  t.equal(errorCodeOf(() => appendOutgoing([], { x: 'a\nb' })), 'EDGE_H3_INVALID_USE');
  t.equal(errorCodeOf(() => appendOutgoing([], { ':path': '/' })), 'EDGE_H3_INVALID_USE', 'pseudo-headers are not the application\'s');
});
