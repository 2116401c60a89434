// Key spec extraction, table-driven: consistent hashing's keys (the client-IP fallback when the
// value is missing) and the tagged selectors of rate limits and quota.
import t from 'tap';
import { compileKeySpec, compileSelector, MAX_RAW_SELECTOR, tagValue } from '../src/balancing/request-key.ts';
import type { KeySource } from '../src/balancing/request-key.ts';

const headers: Record<string, string> = { 'x-tenant': 'acme', cookie: 'a=1; session=s%20x; b=2' };
const req: KeySource = { clientIp: '203.0.113.9', host: 'shop.example.com', path: '/cart/items?user=u%2F1&flag', route: 'shop', header: (n) => headers[n] };

const cases: [string, string][] = [
  ['client_ip', '203.0.113.9'],
  ['host', 'shop.example.com'],
  ['path', '/cart/items'],
  ['route', 'shop'],
  ['header:X-Tenant', 'acme'],
  ['header:x-missing', '203.0.113.9'],
  ['cookie:session', 's%20x'],
  ['cookie:none', '203.0.113.9'],
  ['query:user', 'u/1'],
  ['query:flag', ''],
  ['query:none', '203.0.113.9'],
];
for (const [spec, expected] of cases) t.equal(compileKeySpec(spec)(req), expected, spec);
t.equal(compileKeySpec('query:user')({ ...req, path: '/x?user=%E0%A4%A' }), '%E0%A4%A', 'a malformed escape is kept as is');

// Selectors of rate limits and quota (compileSelector): tagged by the kind of selector, so a value
// of one never equals a value of another (issue 38, finding 4), bounded in length, and the fallback
// explicit.
t.test('compileSelector: each selector in its own key space; the fallback is client_ip (tagged a:) or none', async (t) => {
  const table: [spec: string, fallback: 'client_ip' | 'none', expected: string | undefined][] = [
    ['client_ip', 'client_ip', 'a:203.0.113.9'],
    ['host', 'client_ip', 'n:shop.example.com'],
    ['path', 'client_ip', 'p:/cart/items'],
    ['route', 'client_ip', 'r:shop'],
    ['header:X-Tenant', 'client_ip', 'h:acme'],
    ['header:x-missing', 'client_ip', 'a:203.0.113.9'],
    ['header:x-missing', 'none', undefined],
    ['cookie:session', 'none', 'c:s%20x'],
    ['cookie:none', 'client_ip', 'a:203.0.113.9'],
    ['cookie:none', 'none', undefined],
    ['query:user', 'client_ip', 'q:u/1'],
    ['query:flag', 'none', 'q:'],
    ['query:none', 'client_ip', 'a:203.0.113.9'],
    ['query:none', 'none', undefined],
  ];
  for (const [spec, fallback, expected] of table) t.equal(compileSelector(spec, fallback)(req), expected, `${spec}, key_fallback ${fallback}`);
  t.equal(compileSelector('host', 'client_ip')({ ...req, host: '' }), 'a:203.0.113.9', 'no Host: the client address');
  t.equal(compileSelector('host', 'none')({ ...req, host: '' }), undefined, 'no Host, key_fallback none: no key');
});

t.test('compileSelector: a header, cookie or query value equal to a client address is not that address', async (t) => {
  const spoof: KeySource = { ...req, header: (n) => ({ 'x-api-key': '203.0.113.9', cookie: 'k=203.0.113.9' })[n], path: '/x?k=203.0.113.9' };
  const plain: KeySource = { ...req, header: () => undefined, path: '/x' };
  for (const spec of ['header:x-api-key', 'cookie:k', 'query:k']) {
    const sel = compileSelector(spec, 'client_ip');
    t.equal(sel(plain), 'a:203.0.113.9', `${spec}: the header-less client is keyed by its address`);
    t.not(sel(spoof), sel(plain), `${spec}: the value 203.0.113.9 is another key (${sel(spoof)})`);
  }
  const kinds = ['header:v', 'cookie:v', 'query:v', 'client_ip', 'host', 'path', 'route'].map((s) => compileSelector(s, 'client_ip')({ clientIp: 'v', host: 'v', path: 'v?v=v', route: 'v', header: (n) => (n === 'v' ? 'v' : n === 'cookie' ? 'v=v' : undefined) }));
  t.equal(new Set(kinds).size, kinds.length, `seven selectors reading the value "v": seven keys (${kinds.join(' ')})`);
});

t.test('compileSelector: a value over MAX_RAW_SELECTOR characters is kept as its 43-character digest', async (t) => {
  const sel = compileSelector('header:x-k', 'client_ip');
  const at = (v: string): string | undefined => sel({ ...req, header: (n) => (n === 'x-k' ? v : undefined) });
  t.equal(at('x'.repeat(MAX_RAW_SELECTOR)), `h:${'x'.repeat(MAX_RAW_SELECTOR)}`, `${MAX_RAW_SELECTOR} characters: kept`);
  const long = at('x'.repeat(MAX_RAW_SELECTOR + 1)) ?? '';
  const huge = at('y'.repeat(64 * 1024)) ?? '';
  t.match(long, /^h#[A-Za-z0-9_-]{43}$/, `${MAX_RAW_SELECTOR + 1} characters: the digest`);
  t.equal(huge.length, long.length, `64 KiB value: ${huge.length} characters, as a 65-character one`);
  t.not(huge, long);
  t.equal(tagValue('h', 'a'), 'h:a');
});
