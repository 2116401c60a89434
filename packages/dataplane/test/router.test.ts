// Route resolution, table-driven: host precedence, longest segment prefix, method precedence, 405/404.
import t from 'tap';
import { Router, normalizeHost, normalizePrefix, prefixesOf, routeKey } from '../src/routing/router.ts';
import { pathPolicyForm } from '@edge-proxy/config';
import type { NormalizedUpstream } from '@edge-proxy/config';

function pool(name: string, path_prefix: string, host?: string, methods: string[] = []): NormalizedUpstream {
  return { name, route: { path_prefix, ...(host === undefined ? {} : { host }), methods } } as unknown as NormalizedUpstream;
}

const router = new Router([
  pool('root', '/'),
  pool('api', '/api'),
  pool('api-v2', '/api/v2/'),
  pool('api-write', '/api', undefined, ['POST', 'PUT']),
  pool('shop-exact', '/', 'shop.example.com'),
  pool('shop-checkout', '/checkout', 'shop.example.com', ['POST']),
  pool('wild', '/', '*.example.com'),
  pool('wild-deep', '/', '*.eu.example.com'),
  pool('static', '/static', '*.example.com'),
  pool('admin-get', '/admin', 'admin.internal', ['GET']),
]);

const cases: [string, string | undefined, string, string, string][] = [
  // name, authority, path, method, expected upstream or `404` / `405:ALLOW`
  ['root catches everything', 'other.test', '/x', 'GET', 'root'],
  ['prefix on a segment boundary', 'other.test', '/api/users', 'GET', 'api'],
  ['prefix itself', 'other.test', '/api', 'GET', 'api'],
  ['no match inside a segment', 'other.test', '/apix', 'GET', 'root'],
  ['longest prefix wins; trailing slash ignored', 'other.test', '/api/v2/items', 'GET', 'api-v2'],
  ['explicit method list beats all-methods at one prefix', 'other.test', '/api/users', 'POST', 'api-write'],
  ['query string ignored', 'other.test', '/api?x=/static', 'GET', 'api'],
  ['exact host beats wildcard and any', 'shop.example.com', '/api', 'GET', 'shop-exact'],
  ['exact host with port and case', 'SHOP.example.com:443', '/x', 'GET', 'shop-exact'],
  ['exact host, longer prefix with method', 'shop.example.com', '/checkout/pay', 'POST', 'shop-checkout'],
  ['exact host, method not on the longer prefix falls to a shorter one', 'shop.example.com', '/checkout/pay', 'GET', 'shop-exact'],
  ['wildcard host', 'blog.example.com', '/x', 'GET', 'wild'],
  ['longest wildcard suffix first', 'paris.eu.example.com', '/x', 'GET', 'wild-deep'],
  ['wildcard group longest prefix', 'blog.example.com', '/static/a.css', 'GET', 'static'],
  ['wildcard does not match the bare suffix', 'example.com', '/x', 'GET', 'root'],
  ['trailing dot on host', 'blog.example.com.', '/x', 'GET', 'wild'],
  ['method not allowed anywhere on the path', 'admin.internal', '/admin/users', 'DELETE', 'root'],
  ['missing authority uses host-less routes', undefined, '/api', 'GET', 'api'],
];

for (const [name, authority, path, method, expected] of cases) {
  t.test(name, async (t) => {
    const r = router.resolve(authority, path, method);
    t.equal(r.kind === 'match' ? r.upstream : r.kind, expected);
  });
}

t.test('405 lists the methods the matching routes accept; 404 when no prefix matches', async (t) => {
  const only = new Router([pool('admin-get', '/admin', 'admin.internal', ['GET', 'HEAD']), pool('admin-post', '/admin/users', 'admin.internal', ['POST'])]);
  t.same(only.resolve('admin.internal', '/admin/users', 'DELETE'), { kind: 'method_not_allowed', allowed: ['GET', 'HEAD', 'POST'] });
  t.same(only.resolve('admin.internal', '/other', 'GET'), { kind: 'not_found' });
  t.same(only.resolve('else.internal', '/admin', 'GET'), { kind: 'not_found' });
});

t.test('route reasons name the host match, prefix and method match', async (t) => {
  t.same(router.resolve('blog.example.com', '/static/x', 'GET'), { kind: 'match', upstream: 'static', reason: { host: 'wildcard', prefix: '/static', method: 'any' } });
  t.same(router.resolve('x', '/api/a', 'PUT'), { kind: 'match', upstream: 'api-write', reason: { host: 'any', prefix: '/api', method: 'explicit' } });
});

t.test('segment prefixes of a path, bounded by its segments', async (t) => {
  t.same([...prefixesOf('/a/b/c')], ['/a/b/c', '/a/b', '/a', '/']);
  t.same([...prefixesOf('/a/b/')], ['/a/b', '/a', '/']);
  t.same([...prefixesOf('/')], ['/']);
  t.same([...prefixesOf('')], ['/']);
});

// Below: cases the mutation run (docs/testing.md) found unchecked.

t.test('prefix and host normalization', async (t) => {
  const cases: [string, string][] = [['/', '/'], ['/api/', '/api'], ['/api//', '/api'], ['//', '/'], ['/api', '/api'], ['', '']];
  for (const [input, out] of cases) t.equal(normalizePrefix(input), out, `prefix ${JSON.stringify(input)}`);
  const hosts: [string | undefined, string][] = [
    [undefined, ''], ['', ''], ['Example.COM', 'example.com'], ['example.com:8443', 'example.com'], ['example.com.', 'example.com'],
    ['[2001:DB8::1]:443', '[2001:db8::1]'], ['[::1]', '[::1]'], ['[::1', '[::1'],
  ];
  for (const [input, out] of hosts) t.equal(normalizeHost(input), out, `host ${JSON.stringify(input)}`);
  t.same([...prefixesOf('/a/b//')], ['/a/b', '/a', '/'], 'every trailing slash is dropped');
});

t.test('an IPv6 authority is matched with its brackets and without its port', async (t) => {
  const r = new Router([pool('v6', '/', '[::1]'), pool('any', '/')]);
  const v6 = r.resolve('[::1]:8443', '/x', 'GET');
  t.equal(v6.kind === 'match' ? v6.upstream : v6.kind, 'v6');
});

t.test('exact hosts are exact: a longer name or the bare wildcard suffix does not match them', async (t) => {
  t.same(router.resolve('shop.example.com', '/x', 'GET'), { kind: 'match', upstream: 'shop-exact', reason: { host: 'exact', prefix: '/', method: 'any' } });
  const up = (a: string): string => {
    const r = router.resolve(a, '/x', 'GET');
    return r.kind === 'match' ? r.upstream : r.kind;
  };
  t.equal(up('xshop.example.com'), 'wild', 'a longer name ending in an exact host is not that host');
  t.equal(up('.example.com'), 'root', 'the wildcard suffix alone (empty label) is not a subdomain');
});

t.test('405 and 404 across host groups: allowed methods merge; a group without the prefix does not end the search', async (t) => {
  const r = new Router([
    pool('a-get', '/admin', 'a.test', ['GET']),
    pool('w-post', '/admin', '*.test', ['POST']),
    pool('w-static', '/static', '*.test'),
    pool('any-put', '/admin', undefined, ['PUT']),
    pool('any-other', '/other'),
  ]);
  t.same(r.resolve('a.test', '/admin', 'DELETE'), { kind: 'method_not_allowed', allowed: ['GET', 'POST', 'PUT'] }, 'exact, wildcard and host-less 405s merge');
  t.same(r.resolve('a.test', '/admin/x', 'PUT'), { kind: 'match', upstream: 'any-put', reason: { host: 'any', prefix: '/admin', method: 'explicit' } }, 'a 405 in the host groups still lets a host-less route match');
  t.same(r.resolve('b.test', '/other', 'GET'), { kind: 'match', upstream: 'any-other', reason: { host: 'any', prefix: '/other', method: 'any' } }, 'a wildcard group without the prefix falls through');
  t.same(r.resolve('zzz', '/admin', 'GET'), { kind: 'method_not_allowed', allowed: ['PUT'] }, 'a 405 from the host-less routes alone');
  const exactOnly = new Router([pool('a-get', '/admin', 'a.test', ['GET']), pool('any-other', '/other')]);
  t.same(exactOnly.resolve('a.test', '/admin', 'POST'), { kind: 'method_not_allowed', allowed: ['GET'] }, 'an exact-host 405 survives a host-less 404');
  const wildOnly = new Router([pool('w-post', '/admin', '*.test', ['POST']), pool('any-other', '/other')]);
  t.same(wildOnly.resolve('b.test', '/admin', 'GET'), { kind: 'method_not_allowed', allowed: ['POST'] }, 'a wildcard 405 survives a host-less 404');
});

// Issue 38, finding 1: a prefix matches in the policy form of the path (path-form.ts), so a
// spelling that a case-insensitive or `;params`-dropping backend serves as `/jwt/x` routes to the
// `/jwt` pool (and its authentication), never to the catch-all.
t.test('prefixes match in policy form: case, `;params`, `%3B` and Windows tails', async (t) => {
  const r = new Router([pool('public', '/'), pool('jwt', '/jwt'), pool('ext', '/ext'), pool('mixed', '/Admin/Panel/'), pool('files', '/files', undefined, ['GET'])]);
  const cases: [string, string, string][] = [
    // path (already normalized as normalize-target.ts leaves it), method, expected upstream
    ['/jwt/x', 'GET', 'jwt'],
    ['/jwt', 'GET', 'jwt'],
    ['/jwt;a/x', 'GET', 'jwt'],
    ['/jwt;a', 'GET', 'jwt'],
    ['/JWT/x', 'GET', 'jwt'],
    ['/Jwt/x', 'GET', 'jwt'],
    ['/jwt%3Bx/x', 'GET', 'jwt'],
    ['/JWT%3Bx', 'GET', 'jwt'],
    ['/jwt./x', 'GET', 'jwt'],
    ['/jwt%20/x', 'GET', 'jwt'],
    ['/jwt::$DATA/x', 'GET', 'jwt'],
    ['/;x/jwt/x', 'GET', 'jwt'],
    ['/ext;x/forbidden', 'GET', 'ext'],
    ['/EXT/forbidden?q=1', 'GET', 'ext'],
    ['/admin/panel/x', 'GET', 'mixed'],
    ['/ADMIN/PANEL', 'GET', 'mixed'],
    ['/Files;v=1/a', 'GET', 'files'],
    // Still segment-wise: no match inside a segment name.
    ['/jwtx/y', 'GET', 'public'],
    ['/jwt.html', 'GET', 'public'],
    ['/jwt-a;b/c', 'GET', 'public'],
    ['/x/jwt', 'GET', 'public'],
    ['/admin', 'GET', 'public'],
  ];
  for (const [path, method, expected] of cases) {
    const m = r.resolve('h.test', path, method);
    t.equal(m.kind === 'match' ? m.upstream : m.kind, expected, path);
  }
  const noCatchAll = new Router([pool('files', '/files', undefined, ['GET'])]);
  t.same(noCatchAll.resolve('h.test', '/FILES;x/a', 'POST'), { kind: 'method_not_allowed', allowed: ['GET'] }, 'a spelling of a method-restricted prefix gets its 405');
  t.same(noCatchAll.resolve('h.test', '/filesx', 'GET'), { kind: 'not_found' });
  t.same(r.resolve('h.test', '/ADMIN/Panel/x', 'GET'), { kind: 'match', upstream: 'mixed', reason: { host: 'any', prefix: '/Admin/Panel', method: 'any' } }, 'the reason names the prefix as configured');
});

t.test('route keys: a prefix is normalized as a target, then put in policy form', async (t) => {
  const cases: [string, string][] = [['/', '/'], ['/jwt', '/jwt'], ['/JWT/', '/jwt'], ['/%61pi', '/api'], ['/api;v=1', '/api'], ['/a//b/', '/a/b'], ['/Api%3Bx/y', '/api/y'], ['/x./', '/x']];
  for (const [input, out] of cases) t.equal(routeKey(input), out, input);
});

t.test('an ordinary path is its own policy form: the hot path copies nothing', async (t) => {
  const ordinary = '/api/v1/users/42';
  t.equal(pathPolicyForm(ordinary), ordinary);
  t.equal(pathPolicyForm('/a-b_c~d/e%C3%A9'.toLowerCase()), '/a-b_c~d/e%c3%a9');
  t.equal(pathPolicyForm('/A'), '/a');
});
