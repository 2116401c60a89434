// Control API authentication and authorization as a pure decision (no sockets): allowlist before
// identity, token before certificate, role ranks, the exact status and reason of every refusal.
// api-server.test.ts and test/controlplane-security.test.ts drive the same decisions over HTTPS.
import t from 'tap';
import type { TLSSocket } from 'node:tls';
import type { NormalizedConfig, ResolvedMaterial } from '@edge-proxy/config';
import { Authenticator, roleAtLeast } from '../src/api/auth.ts';
import type { Role } from '../src/api/auth.ts';

interface Setup {
  legacy?: string;
  tokens?: { token: string; role: Role; actor_id: string }[];
  cidrs?: string[];
  roleAttribute?: 'OU' | 'O' | 'CN';
}

function authenticator(s: Setup): Authenticator {
  const tokens = s.tokens ?? [];
  const config = {
    observability: {
      control_api: {
        auth: { bearer_tokens: tokens.map(({ role, actor_id }) => ({ role, actor_id })), ...(s.roleAttribute === undefined ? {} : { identity_source: { role_attribute: s.roleAttribute } }) },
        ...(s.cidrs === undefined ? {} : { ip_allowlist: { cidrs: s.cidrs } }),
      },
    },
  } as unknown as NormalizedConfig;
  const secrets: Record<string, { value: string }> = {};
  if (s.legacy !== undefined) secrets['observability.control_api.auth_token'] = { value: s.legacy };
  tokens.forEach((tk, i) => (secrets[`observability.control_api.auth.bearer_tokens[${i}].token`] = { value: tk.token }));
  return new Authenticator(config, { secrets } as unknown as ResolvedMaterial);
}

/** A TLS socket as far as the authenticator looks at it. */
function socket(authorized = false, subject?: Record<string, string | string[]>): TLSSocket {
  return { authorized, getPeerCertificate: () => (subject === undefined ? {} : { subject }) } as unknown as TLSSocket;
}

const tokens = [
  { token: 'viewer-token', role: 'viewer' as const, actor_id: 'vera' },
  { token: 'operator-token', role: 'operator' as const, actor_id: 'otto' },
  { token: 'admin-token', role: 'admin' as const, actor_id: 'ada' },
];

t.test('roles rank viewer < operator < admin', async (t) => {
  const roles: Role[] = ['viewer', 'operator', 'admin'];
  for (const [i, have] of roles.entries()) for (const [j, need] of roles.entries()) t.equal(roleAtLeast(have, need), i >= j, `${have} >= ${need}`);
});

t.test('bearer tokens: each maps to its actor and role; the role is checked against the route', async (t) => {
  const a = authenticator({ tokens });
  const s = socket();
  t.same(a.decide(s, '127.0.0.1', 'Bearer operator-token', 'operator'), { ok: true, identity: { actor: 'otto', role: 'operator', authn: 'bearer' } });
  t.same(a.decide(s, '127.0.0.1', 'Bearer admin-token', 'operator'), { ok: true, identity: { actor: 'ada', role: 'admin', authn: 'bearer' } });
  t.same(a.decide(s, '127.0.0.1', 'Bearer viewer-token', 'viewer'), { ok: true, identity: { actor: 'vera', role: 'viewer', authn: 'bearer' } });
  t.same(a.decide(s, '127.0.0.1', 'Bearer viewer-token', 'operator'), { ok: false, status: 403, reason: 'insufficient_role', identity: { actor: 'vera', role: 'viewer', authn: 'bearer' } });
  t.same(a.decide(s, '127.0.0.1', 'Bearer operator-token', 'admin'), { ok: false, status: 403, reason: 'insufficient_role', identity: { actor: 'otto', role: 'operator', authn: 'bearer' } });
});

t.test('the Authorization header: scheme case-insensitive, spaces or a tab, trailing blanks; anything else is invalid', async (t) => {
  const a = authenticator({ tokens });
  const s = socket();
  for (const h of ['bearer admin-token', 'BEARER  admin-token', 'Bearer\tadmin-token', 'Bearer admin-token  ']) t.equal(a.decide(s, undefined, h, 'admin').ok, true, JSON.stringify(h));
  for (const h of ['Bearer wrong', 'Bearer admin-token2', 'Bearer admin', 'Basic admin-token', 'Beareradmin-token', 'Bearer ', '', 'Bearer admin-token extra', 'xBearer admin-token', `Bearer ${'a'.repeat(4097)}`]) {
    t.same(a.decide(s, undefined, h, 'viewer'), { ok: false, status: 401, reason: 'invalid_bearer_token' }, JSON.stringify(h));
  }
  t.same(a.decide(s, undefined, undefined, 'viewer'), { ok: false, status: 401, reason: 'missing_authentication' });
});

t.test('the legacy auth_token is a static admin identity', async (t) => {
  const a = authenticator({ legacy: 'old-secret', tokens });
  t.same(a.decide(socket(), undefined, 'Bearer old-secret', 'admin'), { ok: true, identity: { actor: 'legacy-auth-token', role: 'admin', authn: 'bearer' } });
  t.same(a.decide(socket(), undefined, 'Bearer admin-token', 'admin'), { ok: true, identity: { actor: 'ada', role: 'admin', authn: 'bearer' } }, 'the other tokens still count');
  t.equal(authenticator({ tokens }).decide(socket(), undefined, 'Bearer old-secret', 'viewer').ok, false, 'no legacy token configured: not accepted');
});

t.test('a route that needs no role is open to anyone the allowlist admits', async (t) => {
  const a = authenticator({ tokens, cidrs: ['10.0.0.0/8'] });
  t.same(a.decide(socket(), '10.1.2.3', undefined, undefined), { ok: true, identity: { actor: 'anonymous', role: 'viewer', authn: 'bearer' } });
  t.same(a.decide(socket(), '11.1.2.3', 'Bearer admin-token', undefined), { ok: false, status: 403, reason: 'source_ip_not_allowed' });
});

t.test('the allowlist is checked before any credential, for IPv4, IPv4-mapped IPv6 and IPv6', async (t) => {
  const a = authenticator({ tokens, cidrs: ['10.0.0.0/8', '192.168.1.128/25', '2001:db8::/32', '::1/128', 'bogus', '10.0.0.0/x'] });
  const allowed = ['10.0.0.1', '10.255.255.255', '192.168.1.128', '192.168.1.255', '::ffff:10.9.8.7', '::FFFF:192.168.1.200', '2001:db8::1', '2001:db8:ffff:1::', '::1'];
  const refused = ['11.0.0.1', '9.255.255.255', '192.168.1.127', '192.168.0.200', '::ffff:11.0.0.1', '2001:db9::1', '::2', '0:0:0:0:0:0:0:2', 'not-an-ip', '', undefined];
  for (const ip of allowed) {
    t.equal(a.sourceAllowed(ip), true, `${ip} allowed`);
    t.same(a.decide(socket(), ip, 'Bearer admin-token', 'admin').ok, true);
  }
  for (const ip of refused) {
    t.equal(a.sourceAllowed(ip), false, `${String(ip)} refused`);
    t.same(a.decide(socket(), ip, 'Bearer admin-token', 'admin'), { ok: false, status: 403, reason: 'source_ip_not_allowed' }, 'even with a valid admin token');
  }
  t.equal(a.sourceAllowed('0:0:0:0:0:0:0:1'), true, 'the expanded form of ::1');
  t.equal(authenticator({ tokens }).sourceAllowed('203.0.113.9'), true, 'no allowlist: every source');
  t.equal(authenticator({ tokens, cidrs: [] }).sourceAllowed('127.0.0.1'), false, 'an empty allowlist admits nobody');
});

t.test('prefix lengths that are not multiples of 8, and /0', async (t) => {
  const a = authenticator({ cidrs: ['172.16.0.0/12', 'fe80::/10'] });
  for (const ip of ['172.16.0.1', '172.31.255.255', 'fe80::1', 'febf::1']) t.equal(a.sourceAllowed(ip), true, ip);
  for (const ip of ['172.32.0.1', '172.15.255.255', 'fec0::1', 'fe40::1']) t.equal(a.sourceAllowed(ip), false, ip);
  const all4 = authenticator({ cidrs: ['0.0.0.0/0'] });
  t.equal(all4.sourceAllowed('203.0.113.9'), true);
  t.equal(all4.sourceAllowed('2001:db8::1'), false, 'an IPv4 range never admits IPv6');
});

t.test('client certificates: the configured subject attribute gives the role, CN the actor', async (t) => {
  const a = authenticator({ tokens, roleAttribute: 'OU' });
  t.same(a.decide(socket(true, { CN: 'deploy-bot', OU: 'operator' }), undefined, undefined, 'operator'), { ok: true, identity: { actor: 'deploy-bot', role: 'operator', authn: 'mtls' } });
  t.same(a.decide(socket(true, { CN: ['first', 'second'], OU: ['admin', 'viewer'] }), undefined, undefined, 'admin'), { ok: true, identity: { actor: 'first', role: 'admin', authn: 'mtls' } }, 'multi-valued attributes: the first value');
  t.same(a.decide(socket(true, { OU: 'viewer' }), undefined, undefined, 'viewer'), { ok: true, identity: { actor: 'unknown', role: 'viewer', authn: 'mtls' } });
  t.same(a.decide(socket(true, { CN: 'bot', OU: 'viewer' }), undefined, undefined, 'admin'), { ok: false, status: 403, reason: 'insufficient_role', identity: { actor: 'bot', role: 'viewer', authn: 'mtls' } });
  t.same(a.decide(socket(true, { CN: 'bot', OU: 'superuser' }), undefined, undefined, 'viewer'), { ok: false, status: 401, reason: 'missing_authentication' }, 'no role in the attribute');
  t.same(a.decide(socket(true, { CN: 'bot', O: 'admin' }), undefined, undefined, 'viewer'), { ok: false, status: 401, reason: 'missing_authentication' }, 'the role is read from OU only');
  t.same(a.decide(socket(false, { CN: 'bot', OU: 'admin' }), undefined, undefined, 'viewer'), { ok: false, status: 401, reason: 'missing_authentication' }, 'an unverified certificate is no identity');
  t.same(a.decide(socket(true), undefined, undefined, 'viewer'), { ok: false, status: 401, reason: 'missing_authentication' }, 'no certificate');
  const o = authenticator({ roleAttribute: 'O' });
  t.same(o.decide(socket(true, { CN: 'bot', O: 'admin', OU: 'viewer' }), undefined, undefined, 'admin').ok, true, 'role_attribute O');
  const none = authenticator({ tokens });
  t.same(none.decide(socket(true, { CN: 'bot', OU: 'admin' }), undefined, undefined, 'viewer'), { ok: false, status: 401, reason: 'missing_authentication' }, 'certificates map to no identity without identity_source');
});

t.test('certificate and token together: the token decides the role (mtls+bearer); a bad token is refused', async (t) => {
  const a = authenticator({ tokens, roleAttribute: 'OU' });
  const s = socket(true, { CN: 'bot', OU: 'admin' });
  t.same(a.decide(s, undefined, 'Bearer viewer-token', 'viewer'), { ok: true, identity: { actor: 'vera', role: 'viewer', authn: 'mtls+bearer' } });
  t.same(a.decide(s, undefined, 'Bearer viewer-token', 'admin'), { ok: false, status: 403, reason: 'insufficient_role', identity: { actor: 'vera', role: 'viewer', authn: 'mtls+bearer' } });
  t.same(a.decide(s, undefined, 'Bearer nope', 'viewer'), { ok: false, status: 401, reason: 'invalid_bearer_token' }, 'the certificate does not rescue a wrong token');
});

// Below: cases the mutation run (docs/testing.md) found unchecked.

t.test('addresses that only look mapped or valid are not admitted', async (t) => {
  const a = authenticator({ cidrs: ['10.0.0.0/8', 'bogus/8'] });
  for (const ip of ['::ffff:10.0.0.1.5', '1::ffff:10.0.0.1', 'x::ffff:10.0.0.1']) t.equal(a.sourceAllowed(ip), false, ip);
  t.equal(a.sourceAllowed('::ffff:10.0.0.1'), true, 'a real mapped address is');
  const v6 = authenticator({ cidrs: ['::/0'] });
  t.equal(v6.sourceAllowed('2001:db8::1'), true);
  for (const ip of ['not-an-ip', '10.0.0.1', '']) t.equal(v6.sourceAllowed(ip), false, `${ip || 'empty'}: not IPv6`);
  const exact = authenticator({ cidrs: ['::ab/128'] });
  t.equal(exact.sourceAllowed('0:0:0:0:0:0:0:ab'), true, 'a compressed range equals its full spelling');
  t.equal(exact.sourceAllowed('::a:b'), false);
});

t.test('a token whose secret was not resolved is skipped; with duplicate secrets the first entry answers', async (t) => {
  const config = {
    observability: { control_api: { auth: { bearer_tokens: [{ role: 'admin', actor_id: 'unresolved' }, { role: 'viewer', actor_id: 'first' }, { role: 'admin', actor_id: 'second' }] } } },
  } as unknown as NormalizedConfig;
  const secrets = {
    'observability.control_api.auth.bearer_tokens[1].token': { value: 'same' },
    'observability.control_api.auth.bearer_tokens[2].token': { value: 'same' },
  };
  const a = new Authenticator(config, { secrets } as unknown as ResolvedMaterial);
  t.same(a.decide(socket(), undefined, 'Bearer same', 'viewer'), { ok: true, identity: { actor: 'first', role: 'viewer', authn: 'bearer' } });
});

t.test('a destroyed socket (getPeerCertificate null) carries no identity', async (t) => {
  const a = authenticator({ roleAttribute: 'OU' });
  const gone = { authorized: true, getPeerCertificate: () => null } as unknown as TLSSocket;
  t.same(a.decide(gone, undefined, undefined, 'viewer'), { ok: false, status: 401, reason: 'missing_authentication' });
});
