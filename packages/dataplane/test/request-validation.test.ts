// Request validation, table-driven: per protocol, which requests are refused (and with which
// status and reason), which are rewritten to their normalized form, and `OPTIONS *`.
import t from 'tap';
import { DEFAULT_ALLOW, validateRequest } from '../src/policy/request-validation.ts';
import type { ValidationRequest } from '../src/policy/request-validation.ts';
import { hostFieldCount } from '../src/proxy/handler.ts';

const h1: ValidationRequest = { method: 'GET', path: '/x', authority: 'localhost', host: 'localhost', headers: { host: 'localhost' }, protocol: '1.1', duplicateHost: false };
const h2: ValidationRequest = { method: 'GET', path: '/x', authority: 'localhost:443', host: undefined, headers: {}, protocol: '2', scheme: 'https', duplicateHost: false };
const h3: ValidationRequest = { ...h2, protocol: '3' };

const cases: [string, ValidationRequest, Partial<ValidationRequest>, string][] = [
  // name, base, changes, expected: `valid`, `rewrite <path> <authority> <host>`, `options <allow>` or `<status> <reason>`
  ['plain h1', h1, {}, 'valid'],
  ['plain h2', h2, {}, 'valid'],
  ['plain h3', h3, {}, 'valid'],
  ['h1 absolute-form: its authority replaces Host', h1, { path: 'http://api.example/private/x?q', host: 'localhost' }, 'rewrite /private/x?q api.example api.example'],
  ['h1 absolute-form is normalized too', h1, { path: 'https://api.example//a/../private' }, 'rewrite /private api.example api.example'],
  ['h1 absolute-form with userinfo', h1, { path: 'http://u@api.example/x' }, '400 invalid_target_form'],
  ['h2 absolute :path', h2, { path: 'http://localhost/private' }, '400 invalid_target_form'],
  ['h3 absolute :path', h3, { path: 'https://localhost/private' }, '400 invalid_target_form'],
  ['h2 bogus :scheme', h2, { scheme: 'foo' }, '400 invalid_scheme'],
  ['h3 bogus :scheme', h3, { scheme: 'foo', path: 'http://localhost/private' }, '400 invalid_scheme'],
  ['h3 http :scheme', h3, { scheme: 'http' }, 'valid'],
  ['h2 CONNECT has no :scheme', h2, { method: 'CONNECT', scheme: undefined, path: '/' }, 'valid'],
  ['dot segments', h2, { path: '/public/../private' }, 'rewrite /private localhost:443 undefined'],
  ['duplicate slashes', h3, { path: '//private' }, 'rewrite /private localhost:443 undefined'],
  ['encoded slash', h1, { path: '/a%2Fb' }, '400 encoded_separator'],
  ['space in an h3 path', h3, { path: '/a b' }, '400 invalid_target_character'],
  ['OPTIONS * (no allowed_methods)', h1, { method: 'OPTIONS', path: '*' }, `options ${DEFAULT_ALLOW}`],
  ['OPTIONS * on h2', h2, { method: 'OPTIONS', path: '*' }, `options ${DEFAULT_ALLOW}`],
  ['GET *', h1, { path: '*' }, '400 asterisk_target'],
  ['two Host lines', h1, { duplicateHost: true }, '400 duplicate_host'],
  ['Host with userinfo', h1, { authority: 'evil@localhost', host: 'evil@localhost' }, '400 invalid_authority'],
  [':authority with userinfo', h2, { authority: 'evil@localhost' }, '400 invalid_authority'],
  ['h2 host with a path', h2, { host: 'localhost/x' }, '400 invalid_authority'],
  ['h3 control character in a field value', h3, { headers: { 'x-a': 'a\x01b' } }, '400 invalid_header_value'],
  ['h3 DEL in a list value', h3, { headers: { 'x-a': ['ok', 'a\x7f'] } }, '400 invalid_header_value'],
  ['h3 HTAB and obs-text are fine', h3, { headers: { 'x-a': 'a\tb\u00e9' } }, 'valid'],
  ['h3 code point above 0xFF', h3, { headers: { 'x-a': 'a\u0100' } }, '400 invalid_header_value'],
  ['h1 Transfer-Encoding: chunked', h1, { headers: { 'transfer-encoding': 'Chunked ' } }, 'valid'],
  ['h1 Transfer-Encoding: gzip, chunked', h1, { headers: { 'transfer-encoding': 'gzip, chunked' } }, '501 unsupported_transfer_coding'],
  ['content-length with leading zeros is valid (forwarded canonical)', h2, { headers: { 'content-length': '005' } }, 'valid'],
  ['h3 content-length list that agrees', h3, { headers: { 'content-length': '5, 05' } }, 'valid'],
  ['h3 content-length list that differs', h3, { headers: { 'content-length': '5, 6' } }, '400 invalid_content_length'],
  ['repeated content-length lines that differ', h3, { headers: { 'content-length': ['5', '6'] } }, '400 invalid_content_length'],
  ['content-length with a sign', h2, { headers: { 'content-length': '+5' } }, '400 invalid_content_length'],
  ['content-length in hex', h3, { headers: { 'content-length': '0x5' } }, '400 invalid_content_length'],
  ['empty content-length', h3, { headers: { 'content-length': '' } }, '400 invalid_content_length'],
];

t.test('validateRequest', async (t) => {
  for (const [name, base, change, expected] of cases) {
    const v = validateRequest({ ...base, ...change }, []);
    const got = v.kind === 'valid' ? 'valid' : v.kind === 'rewrite' ? `rewrite ${v.path} ${v.authority} ${v.host}` : v.kind === 'options' ? `options ${v.allow}` : `${v.status} ${v.reason}`;
    t.equal(got, expected, name);
  }
});

t.test('hostFieldCount counts Host lines in any case', async (t) => {
  t.equal(hostFieldCount(['Host', 'a', 'x-host', 'b', 'HOST', 'c', 'hosT', 'd', 'hast', 'e']), 3);
  t.equal(hostFieldCount([]), 0);
});

t.test('OPTIONS * lists the policy\'s allowed methods when it has some', async (t) => {
  t.same(validateRequest({ ...h1, method: 'OPTIONS', path: '*' }, ['GET', 'OPTIONS']), { kind: 'options', allow: 'GET, OPTIONS' });
  t.same(validateRequest({ ...h1, method: 'OPTIONS', path: '*' }, ['GET']), { kind: 'valid' }, 'OPTIONS not allowed: left to the policy (405)');
});
