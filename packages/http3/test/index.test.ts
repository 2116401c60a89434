// The public surface, used the way a session layer will: through the package name only.
import t from 'tap';
import * as h3 from '@edge-proxy/http3';
import type { H3Frame, Header } from '@edge-proxy/http3';

t.test('a request travels through frames and QPACK using only the public surface', async (t) => {
  const clientEncoder = new h3.QpackEncoder({ dynamicTable: true });
  const serverDecoder = new h3.QpackDecoder({ maxTableCapacity: 4096, maxBlockedStreams: 16 });
  const serverSettings = h3.encodeSettingsFrame({ qpackMaxTableCapacity: 4096, qpackBlockedStreams: 16, maxFieldSectionSize: 16384 });

  // Client reads the server's control stream and applies its QPACK settings.
  const control = new h3.FrameReader({ stream: 'control', role: 'client' });
  const [settingsFrame] = control.push(serverSettings);
  t.equal(settingsFrame?.type, 'settings');
  if (settingsFrame?.type !== 'settings') return;
  clientEncoder.setPeerSettings(settingsFrame.settings);

  const headers: Header[] = [
    [':method', 'POST'],
    [':scheme', 'https'],
    [':authority', 'example.com'],
    [':path', '/upload'],
    ['x-tenant', 'acme'],
  ];
  const streamBytes = Buffer.concat([
    h3.encodeHeadersFrame(clientEncoder.encodeFieldSection(0, headers)),
    h3.encodeDataFrameHeader(5),
    Buffer.from('hello'),
  ]);
  serverDecoder.onEncoderStreamData(clientEncoder.pendingEncoderStreamBytes());

  const reader = new h3.FrameReader();
  const frames: H3Frame[] = reader.push(streamBytes);
  reader.end();
  const headersFrame = frames[0];
  t.equal(headersFrame?.type, 'headers');
  if (headersFrame?.type !== 'headers') return;
  t.same(serverDecoder.decodeFieldSection(0, headersFrame.fieldSection), { blocked: false, headers });
  t.same(frames.slice(1).map((f) => f.type === 'data' && Buffer.from(f.data).toString()), ['hello']);
});

t.test('errors expose code, wire code and scope', async (t) => {
  try {
    new h3.FrameReader().push(Uint8Array.of(0x02, 0x00));
    t.fail('expected an error');
  } catch (err) {
    t.ok(h3.isH3Error(err));
    t.match(err, { code: 'H3_FRAME_UNEXPECTED', wireCode: 0x105, scope: 'connection' });
  }
});
