// The server-side crypto handed to the QUIC library: HMAC-SHA256 under the shared key (server
// connection IDs, Retry tokens), with the key object prepared once. The MACs must be exactly
// HMAC-SHA256, whichever key the library passes.
import { createHmac, randomBytes } from 'node:crypto';
import t from 'tap';
import { serverCrypto } from '../src/quic-adapter.ts';

const ab = (b: Uint8Array): ArrayBuffer => Uint8Array.from(b).buffer;
const hmac = (key: Uint8Array, data: Uint8Array): string => createHmac('sha256', key).update(data).digest('hex');

t.test('sign is HMAC-SHA256 under the key given, and under any other key passed', async (t) => {
  const key = randomBytes(32);
  const crypto = serverCrypto(key);
  const data = randomBytes(20);
  for (let i = 0; i < 3; i++) {
    t.equal(Buffer.from(await crypto.ops.sign(crypto.key, ab(data))).toString('hex'), hmac(key, data), `call ${i + 1} with the server key`);
  }
  const other = randomBytes(32);
  t.equal(Buffer.from(await crypto.ops.sign(ab(other), ab(data))).toString('hex'), hmac(other, data), 'another key: its own HMAC');
  t.same(new Uint8Array(crypto.key), new Uint8Array(key), 'the key the library holds is a copy of the bytes');
});

t.test('verify accepts the MAC and refuses a changed one or a changed message', async (t) => {
  const key = randomBytes(32);
  const crypto = serverCrypto(key);
  const data = randomBytes(40);
  const sig = await crypto.ops.sign(crypto.key, ab(data));
  t.equal(await crypto.ops.verify(crypto.key, ab(data), sig), true);
  const bad = new Uint8Array(sig);
  bad[0] = (bad[0] as number) ^ 1;
  t.equal(await crypto.ops.verify(crypto.key, ab(data), bad.buffer), false, 'one bit of the MAC changed');
  const changed = Uint8Array.from(data);
  changed[5] = (changed[5] as number) ^ 0x80;
  t.equal(await crypto.ops.verify(crypto.key, ab(changed), sig), false, 'one bit of the message changed');
  t.equal(await crypto.ops.verify(crypto.key, ab(data), sig.slice(0, 16)), false, 'a truncated MAC');
});
