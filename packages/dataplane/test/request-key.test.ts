// Key spec extraction, table-driven, including the client-IP fallback when the value is missing.
import t from 'tap';
import { compileKeySpec } from '../src/balancing/request-key.ts';
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
