// Protocol policy, table-driven: each rule with a request that passes and one that is rejected
// with its status and reason.
import t from 'tap';
import { validateConfig } from '@edge-proxy/config';
import { checkProtocolPolicy, deniedPath } from '../src/policy/protocol-policy.ts';
import type { PolicyRequest, ProtocolPolicy } from '../src/policy/protocol-policy.ts';
import { validateRequest } from '../src/policy/request-validation.ts';
import type { ValidationRequest } from '../src/policy/request-validation.ts';

function policy(overrides: Record<string, unknown> = {}): ProtocolPolicy {
  const r = validateConfig(
    {
      listen: { tls: { cert: 'c', key: 'k' } },
      upstream: { a: { route: { path_prefix: '/' }, backends: [{ id: 'a', address: 'h' }] } },
      resilience: { protocol: overrides },
    },
    '/tmp',
  );
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return r.value.config.resilience.protocol;
}

const base: PolicyRequest = { method: 'GET', path: '/x', authority: 'a.example:443', host: undefined, headerCount: 5, headerBytes: 200, upgrade: false, ingress: 'quic', earlyData: false };

const cases: [string, Record<string, unknown>, Partial<PolicyRequest>, string][] = [
  // name, policy overrides, request changes, expected `ok` or `status reason`
  ['defaults accept a plain GET', {}, {}, 'ok'],
  ['header count at the limit', { max_headers_count: 5 }, {}, 'ok'],
  ['header count over the limit', { max_headers_count: 4 }, {}, '431 header_count'],
  ['header bytes over the limit', { max_headers_bytes: 256 }, { headerBytes: 257 }, '431 header_bytes'],
  ['Host equal to :authority (case and port ignored)', {}, { host: 'A.EXAMPLE' }, 'ok'],
  ['Host differs from :authority', {}, { host: 'b.example' }, '400 authority_host_mismatch'],
  ['mismatch allowed when enforcement is off', { enforce_authority_host_match: false }, { host: 'b.example' }, 'ok'],
  ['allowed method', { allowed_methods: ['GET', 'HEAD'] }, {}, 'ok'],
  ['method outside allowed_methods', { allowed_methods: ['GET', 'HEAD'] }, { method: 'DELETE' }, '405 method_not_allowed'],
  ['denied prefix itself', { denied_path_prefixes: ['/internal'] }, { path: '/internal' }, '403 denied_path'],
  ['below a denied prefix', { denied_path_prefixes: ['/internal'] }, { path: '/internal/metrics?x=1' }, '403 denied_path'],
  ['a sibling of a denied prefix', { denied_path_prefixes: ['/internal'] }, { path: '/internals' }, 'ok'],
  // Denied prefixes are compared case-insensitively and end at a path parameter (docs/decisions.md).
  ['a denied prefix in another case', { denied_path_prefixes: ['/internal'] }, { path: '/INTERNAL/x' }, '403 denied_path'],
  ['a denied prefix configured in upper case', { denied_path_prefixes: ['/Internal/'] }, { path: '/internal' }, '403 denied_path'],
  ['a denied prefix with a path parameter', { denied_path_prefixes: ['/internal'] }, { path: '/internal;jsessionid=1' }, '403 denied_path'],
  ['a denied prefix with an escaped path parameter', { denied_path_prefixes: ['/internal'] }, { path: '/internal%3Bx' }, '403 denied_path'],
  ['a denied prefix with an unnormalized config spelling', { denied_path_prefixes: ['//internal/./x'] }, { path: '/internal/x/y' }, '403 denied_path'],
  ['CONNECT disabled by default', {}, { method: 'CONNECT', authority: 'db:5432' }, '405 connect_disabled'],
  ['Upgrade on bootstrap HTTP/1.1', {}, { upgrade: true, ingress: 'bootstrap-h1' }, 'ok'],
  ['Upgrade on QUIC', {}, { upgrade: true }, '400 upgrade_not_supported'],
  ['Upgrade on bootstrap HTTP/2', {}, { upgrade: true, ingress: 'bootstrap-h2' }, '400 upgrade_not_supported'],
  ['early data refused when 0-RTT is off', {}, { earlyData: true }, '425 early_data_unsafe'],
  ['early data GET with 0-RTT on', { allow_0rtt: true }, { earlyData: true }, 'ok'],
  ['early data POST with 0-RTT on', { allow_0rtt: true }, { earlyData: true, method: 'POST' }, '425 early_data_unsafe'],
];

for (const [name, overrides, change, expected] of cases) {
  t.test(name, async (t) => {
    const v = checkProtocolPolicy(policy(overrides), { ...base, ...change });
    t.equal(v.ok ? 'ok' : `${v.status} ${v.reason}`, expected);
  });
}

t.test('405 carries the Allow list', async (t) => {
  const v = checkProtocolPolicy(policy({ allowed_methods: ['GET', 'HEAD'] }), { ...base, method: 'PUT' });
  t.same(v, { ok: false, status: 405, reason: 'method_not_allowed', allow: ['GET', 'HEAD'] });
});

// Non-canonical spellings of denied paths, judged as the handler judges them: request validation
// (which normalizes the target, routing/normalize-target.ts) and then the protocol policy on the
// normalized path (proxy/handler.ts `route`). Each spelling is either refused as malformed (400)
// or denied (403); none may pass. A spelling that passes is a way around `denied_path_prefixes`
// to a backend that decodes, resolves or strips it into the denied path.
const DENIED = policy({ denied_path_prefixes: ['/internal', '/admin/secret'] });

function judge(path: string, protocol: '1.1' | '2' | '3' = '3'): string {
  const h1 = protocol === '1.1';
  const req: ValidationRequest = { method: 'GET', path, authority: 'a.example', host: h1 ? 'a.example' : undefined, headers: h1 ? { host: 'a.example' } : {}, protocol, ...(h1 ? {} : { scheme: 'https' }) };
  const valid = validateRequest(req, DENIED.allowed_methods);
  if (valid.kind === 'reject') return `${valid.status} ${valid.reason}`;
  const normalized = valid.kind === 'rewrite' ? valid.path : path;
  const v = checkProtocolPolicy(DENIED, { ...base, path: normalized, ingress: h1 ? 'bootstrap-h1' : protocol === '2' ? 'bootstrap-h2' : 'quic' });
  return v.ok ? `ok ${normalized}` : `${v.status} ${v.reason}`;
}

const spellings: [string, string, string][] = [
  // name, target, expected (`403 denied_path`, or a 400 validation reason)
  ['percent-encoded letter', '/%69nternal', '403 denied_path'],
  ['percent-encoded letters, lower and upper hex', '/%69%6E%74ernal/x', '403 denied_path'],
  ['every letter percent-encoded', '/%69%6e%74%65%72%6e%61%6c', '403 denied_path'],
  ['encoded slash (upper hex)', '/admin%2Fsecret', '400 encoded_separator'],
  ['encoded slash (lower hex)', '/admin%2fsecret', '400 encoded_separator'],
  ['encoded slash after the prefix', '/internal%2fx', '400 encoded_separator'],
  ['encoded backslash', '/admin%5Csecret', '400 encoded_separator'],
  ['encoded NUL after the prefix', '/internal%00', '400 encoded_separator'],
  ['encoded dot-dot climbing into it', '/x/%2e%2e/internal', '403 denied_path'],
  ['encoded dot-dot, upper hex', '/x/%2E%2E/admin/secret', '403 denied_path'],
  ['half-encoded dot-dot', '/x/.%2e/internal', '403 denied_path'],
  ['dot segment', '/./internal', '403 denied_path'],
  ['dot segment inside', '/admin/./secret', '403 denied_path'],
  ['encoded dot segment', '/admin/%2e/secret', '403 denied_path'],
  ['dot-dot segment', '/a/../internal', '403 denied_path'],
  ['dot-dot above the root', '/../../internal', '403 denied_path'],
  ['dot-dot inside the prefix', '/admin/x/../secret/y', '403 denied_path'],
  ['double slash before', '//internal', '403 denied_path'],
  ['double slash inside', '/admin//secret', '403 denied_path'],
  ['many slashes', '///admin///secret///', '403 denied_path'],
  ['upper case', '/INTERNAL', '403 denied_path'],
  ['mixed case', '/Admin/SeCreT/x', '403 denied_path'],
  ['mixed case, percent-encoded', '/%49nternal', '403 denied_path'],
  ['trailing slash', '/internal/', '403 denied_path'],
  ['trailing slash on a two-segment prefix', '/admin/secret/', '403 denied_path'],
  ['query', '/internal?x=1', '403 denied_path'],
  ['empty query', '/admin/secret?', '403 denied_path'],
  ['query holding a slash', '/internal?/public', '403 denied_path'],
  ['fragment', '/internal#x', '400 invalid_target_character'],
  ['fragment before the prefix', '/public#/../internal', '400 invalid_target_character'],
  ['backslash', '/admin\\secret', '400 invalid_target_character'],
  ['backslash dot-dot', '/x\\..\\internal', '400 invalid_target_character'],
  // Overlong UTF-8 (RFC 3629 §10): `%C0%AE` is '.' and `%C0%AF` '/' to a lenient decoder.
  ['overlong dot-dot (2 bytes)', '/x/%C0%AE%C0%AE/internal', '400 invalid_percent_encoding'],
  ['overlong slash (2 bytes)', '/admin%c0%afsecret', '400 invalid_percent_encoding'],
  ['overlong dot (3 bytes)', '/x/%E0%80%AE%E0%80%AE/internal', '400 invalid_percent_encoding'],
  ['overlong dot (4 bytes)', '/x/%F0%80%80%AE%F0%80%80%AE/internal', '400 invalid_percent_encoding'],
  ['truncated escape', '/internal%2', '400 invalid_percent_encoding'],
  ['escape with a non-hex digit', '/%6Gnternal', '400 invalid_percent_encoding'],
  ['raw non-ASCII', '/ınternal', '400 invalid_target_character'],
  ['path parameter', '/internal;jsessionid=1', '403 denied_path'],
  ['path parameter, escaped', '/internal%3bx', '403 denied_path'],
  ['path parameter inside a two-segment prefix', '/admin;x/secret', '403 denied_path'],
  ['escaped path parameter inside a two-segment prefix', '/admin%3Bx/secret', '403 denied_path'],
  ['empty path parameter inside a two-segment prefix', '/admin;/secret;/', '403 denied_path'],
  ['a parameter-only segment before the prefix', '/;x/internal', '403 denied_path'],
  ['dot-dot with parameters', '/x/..;/internal', '400 dot_segment_parameters'],
  // Names Windows (IIS, NTFS) trims to the denied one: trailing dots and spaces, the ::$DATA stream.
  ['trailing dot', '/internal.', '403 denied_path'],
  ['trailing dots, one encoded', '/internal.%2e/x', '403 denied_path'],
  ['trailing encoded space', '/internal%20', '403 denied_path'],
  ['trailing dot inside a two-segment prefix', '/admin./secret', '403 denied_path'],
  ['NTFS data stream', '/internal::$DATA', '403 denied_path'],
  ['NTFS data stream, lower case, inside', '/admin::$data/secret/x', '403 denied_path'],
  ['encoded dot-dot with parameters', '/x/%2e%2e;/internal', '400 dot_segment_parameters'],
];

for (const [name, target, expected] of spellings) {
  t.test(`denied path, non-canonical: ${name} (${target})`, async (t) => {
    for (const protocol of ['1.1', '2', '3'] as const) t.equal(judge(target, protocol), expected, `HTTP/${protocol}`);
  });
}

t.test('denied path, absolute-form on HTTP/1.1 is normalized and denied', async (t) => {
  t.equal(judge('http://a.example/%2e/INTERNAL', '1.1'), '403 denied_path');
  t.equal(judge('http://a.example//admin/./secret?x', '1.1'), '403 denied_path');
});

t.test('near misses of denied paths are not denied (the checks do not deny everything)', async (t) => {
  t.equal(judge('/internals'), 'ok /internals');
  t.equal(judge('/public/internal'), 'ok /public/internal');
  t.equal(judge('/admin/secrets'), 'ok /admin/secrets');
  t.equal(judge('/admin;x/public'), 'ok /admin;x/public');
  t.equal(judge('/admin'), 'ok /admin');
  t.equal(judge('/x?/internal'), 'ok /x?/internal');
  t.equal(judge('/internal.html'), 'ok /internal.html');
  t.equal(judge('/internal.d/x'), 'ok /internal.d/x');
  t.equal(judge('/internal%20x'), 'ok /internal%20x');
  t.equal(judge('/internal::$data2'), 'ok /internal::$data2');
  t.equal(judge('/admin/secret.txt'), 'ok /admin/secret.txt');
  t.equal(judge('/%C3%A9/internal-not'), 'ok /%C3%A9/internal-not');
  // Valid UTF-8 escapes and other non-ASCII escapes are kept (RFC 3986 does not require UTF-8).
  t.equal(judge('/caf%c3%a9'), 'ok /caf%C3%A9');
  t.equal(judge('/%E0%A0%80'), 'ok /%E0%A0%80');
  t.equal(judge('/%F0%90%80%80'), 'ok /%F0%90%80%80');
  t.equal(judge('/%FF'), 'ok /%FF');
});

// Below: cases the mutation run (docs/testing.md) found unchecked.
const moreCases: [string, Record<string, unknown>, Partial<PolicyRequest>, string][] = [
  ['header bytes at the limit', { max_headers_bytes: 256 }, { headerBytes: 256 }, 'ok'],
  ['Host without :authority is not compared', {}, { authority: undefined, host: 'b.example' }, 'ok'],
  ['IPv6 :authority with a port and Host without', {}, { authority: '[::1]:443', host: '[::1]' }, 'ok'],
  ['a denied prefix with a query right after it', { denied_path_prefixes: ['/internal'] }, { path: '/internal?x=1' }, '403 denied_path'],
  ['a shorter path than a denied prefix', { denied_path_prefixes: ['/internal'] }, { path: '/interna' }, 'ok'],
  ['a path of the same length as a denied prefix', { denied_path_prefixes: ['/internal'] }, { path: '/external' }, 'ok'],
  ['a denied prefix with a trailing slash does not deny other paths', { denied_path_prefixes: ['/internal/'] }, { path: '/other' }, 'ok'],
  ['denied `/` denies everything', { denied_path_prefixes: ['/'] }, { path: '/x' }, '403 denied_path'],
];

for (const [name, overrides, change, expected] of moreCases) {
  t.test(name, async (t) => {
    const v = checkProtocolPolicy(policy(overrides), { ...base, ...change });
    t.equal(v.ok ? 'ok' : `${v.status} ${v.reason}`, expected);
  });
}

t.test('a refusal other than 405 carries no Allow; CONNECT refused lists the allowed methods without CONNECT', async (t) => {
  const v = checkProtocolPolicy(policy({ max_headers_count: 1 }), base);
  t.strictSame(v, { ok: false, status: 431, reason: 'header_count' });
  t.notOk('allow' in v);
  const c = checkProtocolPolicy(policy({ allowed_methods: ['GET', 'CONNECT'] }), { ...base, method: 'CONNECT', authority: 'db:5432' });
  t.strictSame(c, { ok: false, status: 405, reason: 'connect_disabled', allow: ['GET'] });
  const d = checkProtocolPolicy(policy(), { ...base, method: 'CONNECT', authority: 'db:5432' });
  t.strictSame(d, { ok: false, status: 405, reason: 'connect_disabled', allow: ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'] }, 'no allowed_methods: the default set, as OPTIONS * answers it (RFC 9110 §15.5.6: a 405 carries Allow)');
});

t.test('every CONNECT is refused before routing, whatever the policy holds: tunnelling is not built', async (t) => {
  // `allow_connect: true` and the allowlists do not validate (EDGE_CONFIG_NOT_BUILT); a policy that
  // holds them anyway (built by hand here) still refuses, so no CONNECT can be routed to a pool.
  const handMade: ProtocolPolicy = { ...policy({ allow_0rtt: true }), allow_connect: true, connect_allowed_ports: [443, 5432], connect_allowed_authorities: ['db:5432'] };
  const policies: [string, ProtocolPolicy, string, readonly string[]][] = [
    ['defaults', policy(), '405 connect_disabled', ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']],
    ['allowed_methods with CONNECT', policy({ allowed_methods: ['GET', 'CONNECT'] }), '405 connect_disabled', ['GET']],
    ['allowed_methods without CONNECT', policy({ allowed_methods: ['GET', 'HEAD'] }), '405 method_not_allowed', ['GET', 'HEAD']],
    ['allow_connect forced on, with allowlists', handMade, '405 connect_disabled', ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']],
  ];
  const requests: Partial<PolicyRequest>[] = [
    { authority: 'db:5432' },
    { authority: 'db:5432', ingress: 'bootstrap-h1' },
    { authority: 'db:5432', ingress: 'bootstrap-h2' },
    { authority: '[::1]:443' },
    { authority: 'db' },
    { authority: 'a b:443' },
    { authority: 'db:0' },
    { authority: undefined },
    { authority: 'db:5432', earlyData: true },
    { authority: 'db:5432', path: '/chat', upgrade: true },
  ];
  let n = 0;
  for (const [name, p, expected, allow] of policies) {
    for (const r of requests) {
      const v = checkProtocolPolicy(p, { ...base, method: 'CONNECT', ...r });
      t.equal(v.ok ? 'ok' : `${v.status} ${v.reason}`, expected, `${name}: ${JSON.stringify(r)}`);
      t.same(v.ok ? undefined : v.allow, allow, 'with Allow');
      n++;
    }
  }
  t.equal(n, 40);
});

t.test('deniedPath with a prefix that is not an origin-form path: compared as written, lower case', async (t) => {
  t.equal(deniedPath(['Internal'], 'internal/x'), true);
  t.equal(deniedPath(['Internal'], '/internal'), false);
});
