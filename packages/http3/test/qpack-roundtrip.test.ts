// Property tests: whatever the encoder produces, the decoder turns back into the same field lines,
// whatever the delivery order of encoder stream data, field sections and acknowledgments.
import t from 'tap';
import fc from 'fast-check';
import { QpackDecoder } from '../src/qpack/decoder.ts';
import type { Header } from '../src/qpack/decoder.ts';
import { QpackEncoder } from '../src/qpack/encoder.ts';
import { STATIC_TABLE } from '../src/qpack/static-table.ts';

const latin1 = fc.string({ unit: fc.integer({ min: 0, max: 255 }).map((c) => String.fromCharCode(c)), maxLength: 40 });
const token = fc.string({ unit: fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz0123456789-'.split('')), minLength: 1, maxLength: 20 });
const staticEntry = fc.constantFrom(...STATIC_TABLE.map(([n, v]) => [n, v] as Header));
const anyHeader: fc.Arbitrary<Header> = fc.oneof(
  staticEntry,
  fc.tuple(fc.constantFrom(...STATIC_TABLE.map(([n]) => n)), latin1),
  fc.tuple(token, latin1),
);
// A small pool so field lines repeat across sections and the dynamic table gets used.
const pooledHeader: fc.Arbitrary<Header> = fc.oneof(
  fc.tuple(fc.constantFrom('x-trace', 'user-agent', 'accept', 'x-tenant', 'authorization', 'cookie', 'x-long'), fc.constantFrom('1', 'abc', '', 'Mozilla/5.0 (X11)', 'v'.repeat(90))),
  anyHeader,
);

t.test('property: static-only round trip', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.array(anyHeader, { maxLength: 20 }), fc.constantFrom('auto', 'never', 'always' as const), (headers, huffman) => {
        const enc = new QpackEncoder({ huffman });
        const dec = new QpackDecoder();
        const section = enc.encodeFieldSection(0, headers);
        const result = dec.decodeFieldSection(0, section);
        return !result.blocked && JSON.stringify(result.headers) === JSON.stringify(headers) && enc.pendingEncoderStreamBytes().length === 0;
      }),
      { numRuns: 1000 },
    );
  }, 'the property holds');
});

// Encoded lines are cached per process (encoder.ts writeCached): a repeat must give the same
// bytes, and each Huffman policy has its own.
t.test('cached field lines: same bytes, per Huffman policy', async (t) => {
  const headers: Header[] = [[':status', '200'], ['content-type', 'text/plain; charset=cached'], ['x-cached-literal', 'aaaaaaaaaaaaaaaa']];
  const auto = new QpackEncoder({ huffman: 'auto' }).encodeFieldSection(0, headers);
  t.same(new QpackEncoder({ huffman: 'auto' }).encodeFieldSection(4, headers), auto, 'a repeat gives the same bytes');
  const never = new QpackEncoder({ huffman: 'never' }).encodeFieldSection(0, headers);
  t.ok(Buffer.from(never).includes(Buffer.from('text/plain; charset=cached', 'latin1')), "'never' sends the value as is, after 'auto' cached it Huffman-coded");
  t.notOk(Buffer.from(auto).includes(Buffer.from('text/plain; charset=cached', 'latin1')), "'auto' sends it Huffman-coded");
  for (const section of [auto, never]) t.same(new QpackDecoder().decodeFieldSection(0, section), { blocked: false, headers }, 'decodes to the lines');
});

t.test('non-latin1 text is sent as UTF-8 octets', async (t) => {
  const enc = new QpackEncoder();
  const dec = new QpackDecoder();
  const result = dec.decodeFieldSection(0, enc.encodeFieldSection(0, [['x-name', 'caf\u00e9 \u20ac']]));
  t.same(result, { blocked: false, headers: [['x-name', Buffer.from('caf\u00e9 \u20ac', 'utf8').toString('latin1')]] });
});

interface Step {
  headers: Header[];
  /** Deliver the encoder stream bytes after the section (exercises blocking). */
  sectionFirst: boolean;
  /** Hold back the decoder stream bytes until the next step. */
  delayAcks: boolean;
}

t.test('property: dynamic table round trip under reordering', async (t) => {
  const stepArb: fc.Arbitrary<Step> = fc.record({
    headers: fc.array(pooledHeader, { maxLength: 12 }),
    sectionFirst: fc.boolean(),
    delayAcks: fc.boolean(),
  });
  // Counters prove the property exercised blocking and the dynamic table, not just literals.
  let blockedSections = 0;
  let inserts = 0;
  fc.assert(
    fc.property(
      fc.array(stepArb, { minLength: 1, maxLength: 12 }),
      fc.constantFrom(0, 64, 200, 1000, 4096),
      fc.nat(3),
      fc.boolean(),
      (steps, peerCapacity, blockedStreams, firstUse) => {
        const enc = new QpackEncoder({ dynamicTable: true, insertOnFirstUse: firstUse });
        const dec = new QpackDecoder({ maxTableCapacity: peerCapacity, maxBlockedStreams: blockedStreams });
        enc.setPeerSettings({ qpackMaxTableCapacity: peerCapacity, qpackBlockedStreams: blockedStreams });
        const decoded = new Map<number, Header[]>();
        let heldAcks = new Uint8Array(0);
        steps.forEach((step, i) => {
          const streamId = i * 4;
          const section = enc.encodeFieldSection(streamId, step.headers);
          const encoderBytes = enc.pendingEncoderStreamBytes();
          const take = (r: ReturnType<QpackDecoder['decodeFieldSection']>): void => {
            if (!r.blocked) decoded.set(streamId, r.headers);
            else blockedSections++;
          };
          const collect = (list: ReturnType<QpackDecoder['onEncoderStreamData']>): void => {
            for (const u of list) if (u.error === undefined) decoded.set(u.streamId, u.headers);
          };
          if (step.sectionFirst) {
            take(dec.decodeFieldSection(streamId, section));
            collect(dec.onEncoderStreamData(encoderBytes));
          } else {
            collect(dec.onEncoderStreamData(encoderBytes));
            take(dec.decodeFieldSection(streamId, section));
          }
          const acks = dec.pendingDecoderStreamBytes();
          if (step.delayAcks) {
            heldAcks = Buffer.concat([heldAcks, acks]);
          } else {
            enc.onDecoderStreamData(Buffer.concat([heldAcks, acks]));
            heldAcks = new Uint8Array(0);
          }
        });
        enc.onDecoderStreamData(heldAcks);
        inserts += enc.insertCount;
        steps.forEach((step, i) => {
          const got = decoded.get(i * 4);
          if (JSON.stringify(got) !== JSON.stringify(step.headers)) throw new Error(`stream ${i * 4}: ${JSON.stringify(got)}`);
        });
        // Every section was acknowledged, so nothing can be blocked any more.
        return dec.blockedStreamCount === 0 && enc.blockedStreamCount === 0;
      },
    ),
    { numRuns: 500 },
  );
  t.ok(blockedSections > 0, `some sections were blocked (${blockedSections})`);
  t.ok(inserts > 0, `the dynamic table was used (${inserts} inserts)`);
});

t.test('dynamic mode compresses repeated field lines and stays within peer limits', async (t) => {
  const enc = new QpackEncoder({ dynamicTable: true });
  enc.setPeerSettings({ qpackMaxTableCapacity: 4096, qpackBlockedStreams: 0 });
  const dec = new QpackDecoder({ maxTableCapacity: 4096, maxBlockedStreams: 0 });
  const headers: Header[] = [
    ['user-agent', 'Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/140.0'],
    ['x-tenant', 'acme-corp-production'],
  ];
  const sizes: number[] = [];
  for (let i = 0; i < 4; i++) {
    const section = enc.encodeFieldSection(i * 4, headers);
    sizes.push(section.length);
    dec.onEncoderStreamData(enc.pendingEncoderStreamBytes());
    const r = dec.decodeFieldSection(i * 4, section);
    t.same(r, { blocked: false, headers }, `section ${i} decodes without blocking (peer allows 0 blocked streams)`);
    enc.onDecoderStreamData(dec.pendingDecoderStreamBytes());
  }
  t.ok((sizes[3] as number) <= 4, `fourth section is two one-byte references plus prefix (${sizes.join(', ')})`);
  t.ok((sizes[0] as number) > 40, 'first section is literal');
});

t.test('encoder never blocks more streams than the peer allows', async (t) => {
  const enc = new QpackEncoder({ dynamicTable: true, insertOnFirstUse: true });
  enc.setPeerSettings({ qpackMaxTableCapacity: 4096, qpackBlockedStreams: 2 });
  for (let i = 0; i < 6; i++) enc.encodeFieldSection(i * 4, [[`x-h${i}`, 'v']]);
  t.equal(enc.blockedStreamCount, 2);
  t.equal(enc.insertCount, 6, 'inserts still happen for later use');
});
