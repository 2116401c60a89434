// Hand-built HTTP/2 frames (RFC 9113 §4.1, §6) and HPACK blocks (RFC 7541) for abuse tests: what a
// well-behaved client library refuses to send (rapid resets, endless CONTINUATION, floods).
import tls from 'node:tls';
import { once } from 'node:events';

export const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
export const DATA = 0x0;
export const HEADERS = 0x1;
export const RST_STREAM = 0x3;
export const SETTINGS = 0x4;
export const PING = 0x6;
export const WINDOW_UPDATE = 0x8;
export const CONTINUATION = 0x9;
export const END_STREAM = 0x1;
export const END_HEADERS = 0x4;
/** RFC 9113 §6.5.2 */
export const SETTINGS_HEADER_TABLE_SIZE = 0x1;
export const SETTINGS_INITIAL_WINDOW_SIZE = 0x4;

export function frame(type: number, flags: number, streamId: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(streamId & 0x7fffffff, 5);
  return Buffer.concat([head, payload]);
}

export function settings(values: [number, number][] = []): Buffer {
  const p = Buffer.alloc(values.length * 6);
  values.forEach(([id, v], i) => {
    p.writeUInt16BE(id, i * 6);
    p.writeUInt32BE(v, i * 6 + 2);
  });
  return frame(SETTINGS, 0, 0, p);
}

export function u32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v);
  return b;
}

/** An HPACK string literal without Huffman coding (lengths < 127 only, RFC 7541 §5.2). */
function str(s: string): Buffer {
  if (s.length >= 127) throw new Error('short strings only');
  return Buffer.concat([Buffer.from([s.length]), Buffer.from(s, 'latin1')]);
}

/** GET https://<authority><path>: static-table entries, the authority as a literal without indexing. */
export function requestBlock(path = '/', authority = 'localhost', method: 'GET' | 'POST' = 'GET'): Buffer {
  const p = path === '/' ? Buffer.from([0x84]) : Buffer.concat([Buffer.from([0x04]), str(path)]);
  return Buffer.concat([Buffer.from([method === 'GET' ? 0x82 : 0x83, 0x87]), p, Buffer.from([0x01]), str(authority)]);
}

/** A literal header field with incremental indexing and a new name (RFC 7541 §6.2.1): grows the peer's dynamic table. */
export function indexedLiteral(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x40]), str(name), str(value)]);
}

/** A raw TLS connection that spoke the preface and an empty SETTINGS; reads are discarded unless `read`. */
export async function rawH2(port: number, read = true): Promise<tls.TLSSocket> {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ALPNProtocols: ['h2'], rejectUnauthorized: false });
  s.on('error', () => undefined);
  await once(s, 'secureConnect');
  if (read) s.resume();
  else s.pause();
  s.write(Buffer.concat([PREFACE, settings()]));
  return s;
}

/** Resolves with the first GOAWAY the peer sends on `s` (last stream id, error code); rejects if `s` closes first or after `limitMs`. */
export function nextGoaway(s: tls.TLSSocket, limitMs: number): Promise<{ lastStreamId: number; errorCode: number }> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const done = (): void => {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('close', onClose);
    };
    const onData = (d: Buffer): void => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) return;
        if (buf[3] === 0x7) {
          done();
          resolve({ lastStreamId: buf.readUInt32BE(9) & 0x7fffffff, errorCode: buf.readUInt32BE(13) });
          return;
        }
        buf = buf.subarray(9 + len);
      }
    };
    const onClose = (): void => {
      done();
      reject(new Error('closed without GOAWAY'));
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error(`no GOAWAY within ${limitMs} ms`));
    }, limitMs);
    s.on('data', onData);
    s.on('close', onClose);
  });
}
