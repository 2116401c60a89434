// Protocol policy, table-driven: each rule with a request that passes and one that is rejected
// with its status and reason.
import t from 'tap';
import { validateConfig } from '@edge-proxy/config';
import { checkProtocolPolicy, deniedPath } from '../src/policy/protocol-policy.ts';
import type { PolicyRequest, ProtocolPolicy } from '../src/policy/protocol-policy.ts';

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
  ['CONNECT allowed', { allow_connect: true }, { method: 'CONNECT', authority: 'db:5432' }, 'ok'],
  ['CONNECT without host:port', { allow_connect: true }, { method: 'CONNECT', authority: 'db' }, '400 connect_target'],
  ['CONNECT to a port outside the allowlist', { allow_connect: true, connect_allowed_ports: [443] }, { method: 'CONNECT', authority: 'db:5432' }, '403 connect_port'],
  ['CONNECT to an authority outside the allowlist', { allow_connect: true, connect_allowed_authorities: ['db:5432'] }, { method: 'CONNECT', authority: 'other:5432' }, '403 connect_authority'],
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
  ['CONNECT to an IPv6 literal', { allow_connect: true }, { method: 'CONNECT', authority: '[::1]:443' }, 'ok'],
  ['CONNECT with a space in the host', { allow_connect: true }, { method: 'CONNECT', authority: 'a b:443' }, '400 connect_target'],
  ['CONNECT with a path after the port', { allow_connect: true }, { method: 'CONNECT', authority: 'db:5432/x' }, '400 connect_target'],
  ['CONNECT port 0', { allow_connect: true }, { method: 'CONNECT', authority: 'db:0' }, '400 connect_target'],
  ['CONNECT port 1', { allow_connect: true }, { method: 'CONNECT', authority: 'db:1' }, 'ok'],
  ['CONNECT port 65535', { allow_connect: true }, { method: 'CONNECT', authority: 'db:65535' }, 'ok'],
  ['CONNECT port 65536', { allow_connect: true }, { method: 'CONNECT', authority: 'db:65536' }, '400 connect_target'],
  ['CONNECT authority allowlist is case-insensitive', { allow_connect: true, connect_allowed_authorities: ['DB.internal:5432'] }, { method: 'CONNECT', authority: 'db.INTERNAL:5432' }, 'ok'],
  ['CONNECT in early data', { allow_connect: true, allow_0rtt: true }, { method: 'CONNECT', authority: 'db:5432', earlyData: true }, '425 early_data_unsafe'],
];

for (const [name, overrides, change, expected] of moreCases) {
  t.test(name, async (t) => {
    const v = checkProtocolPolicy(policy(overrides), { ...base, ...change });
    t.equal(v.ok ? 'ok' : `${v.status} ${v.reason}`, expected);
  });
}

t.test('a refusal other than 405 carries no Allow; CONNECT disabled lists the allowed methods without CONNECT', async (t) => {
  const v = checkProtocolPolicy(policy({ max_headers_count: 1 }), base);
  t.strictSame(v, { ok: false, status: 431, reason: 'header_count' });
  t.notOk('allow' in v);
  const c = checkProtocolPolicy(policy({ allowed_methods: ['GET', 'CONNECT'] }), { ...base, method: 'CONNECT', authority: 'db:5432' });
  t.strictSame(c, { ok: false, status: 405, reason: 'connect_disabled', allow: ['GET'] });
  const d = checkProtocolPolicy(policy(), { ...base, method: 'CONNECT', authority: 'db:5432' });
  t.strictSame(d, { ok: false, status: 405, reason: 'connect_disabled' }, 'no allowed_methods: no Allow list');
});

t.test('deniedPath with a prefix that is not an origin-form path: compared as written, lower case', async (t) => {
  t.equal(deniedPath(['Internal'], 'internal/x'), true);
  t.equal(deniedPath(['Internal'], '/internal'), false);
});
