// The request-target normalizer, table-driven (RFC 3986 §5.2.4 remove_dot_segments, §6.2.2
// syntax-based normalization): every shape that could reach a denied prefix, what it becomes, or
// why it is refused; and the fast path returns the very string it was given.
import t from 'tap';
import { isTargetRejection, isValidAuthority, normalizeOriginForm, splitAbsoluteForm } from '../src/routing/normalize-target.ts';

const cases: [string, string][] = [
  // input, expected normalized target or `reject <reason>`
  ['/', '/'],
  ['/private/x', '/private/x'],
  ['/private/x?a=../b//c', '/private/x?a=../b//c'],
  ['//private', '/private'],
  ['/a//b///c', '/a/b/c'],
  ['/./private', '/private'],
  ['/public/../private', '/private'],
  ['/public/./../private/', '/private/'],
  ['/../../private', '/private'],
  ['/a/b/..', '/a/'],
  ['/a/b/.', '/a/b/'],
  ['/a/.hidden', '/a/.hidden'],
  ['/a/..b/c', '/a/..b/c'],
  ['/%70rivate', '/private'],
  ['/%2e%2e/private', '/private'],
  ['/public/%2E%2E/private?q', '/private?q'],
  ['/a%7e%5f%2D', '/a~_-'],
  ['/a%3bb', '/a%3Bb'],
  ['/caf%c3%a9', '/caf%C3%A9'],
  ['/PRIVATE', '/PRIVATE'],
  ['/private;x', '/private;x'],
  ['/public/..;/private', 'reject dot_segment_parameters'],
  ['/.;x/private', 'reject dot_segment_parameters'],
  ['/private%2fx', 'reject encoded_separator'],
  ['/private%2Fx', 'reject encoded_separator'],
  ['/private%5cx', 'reject encoded_separator'],
  ['/private%00', 'reject encoded_separator'],
  ['/private%0a', 'reject encoded_separator'],
  ['/private%7F', 'reject encoded_separator'],
  ['/private%zz', 'reject invalid_percent_encoding'],
  ['/private%2', 'reject invalid_percent_encoding'],
  ['/private%', 'reject invalid_percent_encoding'],
  // Overlong UTF-8 (never valid UTF-8; '.' and '/' to a lenient decoder), and the valid neighbours kept.
  ['/%C0%AE%C0%AE/private', 'reject invalid_percent_encoding'],
  ['/%c1%bf', 'reject invalid_percent_encoding'],
  ['/%E0%80%AE', 'reject invalid_percent_encoding'],
  ['/%E0%9F%BF', 'reject invalid_percent_encoding'],
  ['/%F0%80%80%AE', 'reject invalid_percent_encoding'],
  ['/%F0%8F%BF%BF', 'reject invalid_percent_encoding'],
  ['/%E0%A0%80', '/%E0%A0%80'],
  ['/%F0%90%80%80', '/%F0%90%80%80'],
  ['/%E0x%80', '/%E0x%80'],
  ['/%C2%80', '/%C2%80'],
  ['/a b', 'reject invalid_target_character'],
  ['/a\tb', 'reject invalid_target_character'],
  ['/a\x01b', 'reject invalid_target_character'],
  ['/a\x7fb', 'reject invalid_target_character'],
  ['/a\\..\\private', 'reject invalid_target_character'],
  ['/a#frag', 'reject invalid_target_character'],
  ['/caf\u00e9', 'reject invalid_target_character'],
  ['/x?a b', 'reject invalid_target_character'],
  ['http://localhost/private', 'reject invalid_target_form'],
  ['*', 'reject invalid_target_form'],
  ['private', 'reject invalid_target_form'],
];

t.test('normalizeOriginForm', async (t) => {
  for (const [input, expected] of cases) {
    const r = normalizeOriginForm(input);
    t.equal(isTargetRejection(r) ? `reject ${r.reason}` : r, expected, JSON.stringify(input));
  }
});

t.test('a normal target is returned as it is (the fast path allocates nothing)', async (t) => {
  for (const input of ['/', '/a/b.js', '/v1/items?id=7&x=..', '/a;b/c']) t.equal(normalizeOriginForm(input), input);
});

t.test('normalizing is idempotent', async (t) => {
  for (const [input] of cases) {
    const once = normalizeOriginForm(input);
    if (typeof once === 'string') t.equal(normalizeOriginForm(once), once, JSON.stringify(input));
  }
});

t.test('splitAbsoluteForm: authority and origin-form', async (t) => {
  const table: [string, string][] = [
    ['http://localhost/private/x', 'http localhost /private/x'],
    ['https://Example.com:8443?q=1', 'https Example.com:8443 /?q=1'],
    ['HTTP://h', 'http h /'],
    ['http://[::1]:80/a', 'http [::1]:80 /a'],
    ['http://user@localhost/', 'reject invalid_target_form'],
    ['http:///private', 'reject invalid_target_form'],
    ['ftp://h/x', 'reject invalid_target_form'],
    ['localhost:443', 'reject invalid_target_form'],
  ];
  for (const [input, expected] of table) {
    const r = splitAbsoluteForm(input);
    t.equal(isTargetRejection(r) ? `reject ${r.reason}` : `${r.scheme} ${r.authority} ${r.originForm}`, expected, input);
  }
});

t.test('isValidAuthority', async (t) => {
  for (const ok of ['localhost', 'a.example:443', '[::1]:8443', '127.0.0.1', 'xn--caf-dma.example']) t.ok(isValidAuthority(ok), ok);
  for (const bad of ['', 'user@host', 'user:pw@host', 'host/x', 'host?x', 'a b', 'a\x01', 'h\\x', 'h#x']) t.notOk(isValidAuthority(bad), JSON.stringify(bad));
});
