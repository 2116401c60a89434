// The bounded cache of verified tokens and its expiry test, checked against jose's own.
import t from 'tap';
import { SignJWT, jwtVerify } from 'jose';
import { VerificationCache, expiredAt } from '../src/verification-cache.ts';

t.test('least recently used out first, bounded', async (t) => {
  const c = new VerificationCache(3);
  for (const k of ['a', 'b', 'c']) c.set(k, { version: 1, exp: 10 });
  c.get('a');
  c.set('d', { version: 1, exp: 10 });
  t.equal(c.size, 3);
  t.equal(c.get('b'), undefined, 'b was the least recently used');
  t.ok(c.get('a') && c.get('c') && c.get('d'));
  c.set('c', { version: 2, exp: 20 });
  t.same(c.get('c'), { version: 2, exp: 20 }, 'set replaces');
  c.delete('c');
  t.equal(c.get('c'), undefined);
  t.equal(new VerificationCache(0).size, 0);
  const one = new VerificationCache(0); // at least one entry
  one.set('x', { version: 1, exp: 1 });
  one.set('y', { version: 1, exp: 1 });
  t.equal(one.size, 1);
});

t.test('expiredAt agrees with jose at every boundary', async (t) => {
  const secret = new TextEncoder().encode('k'.repeat(32));
  const exp = 2_000_000_000;
  const token = await new SignJWT({ exp }).setProtectedHeader({ alg: 'HS256' }).sign(secret);
  for (const skewMs of [0, 1500, 30_000]) {
    for (const offsetMs of [-31_000, -30_001, -30_000, -1500, -1001, -1000, -999, -1, 0, 1, 999, 1000, 1499, 1500, 29_999, 30_000, 31_000]) {
      const nowMs = exp * 1000 + offsetMs;
      let joseExpired: boolean;
      try {
        await jwtVerify(token, secret, { currentDate: new Date(nowMs), clockTolerance: skewMs / 1000 });
        joseExpired = false;
      } catch (e) {
        joseExpired = (e as { code?: string }).code === 'ERR_JWT_EXPIRED';
      }
      t.equal(expiredAt(exp, nowMs, skewMs), joseExpired, `skew ${skewMs} ms, now = exp ${offsetMs >= 0 ? '+' : ''}${offsetMs} ms`);
    }
  }
});
