// The QUIC library's per-stream overhead, on its own: the lifecycle a proxied HTTP/3 request puts
// one `QUICStream` through, without sockets or quiche. It is created (as a peer's bidirectional
// stream), gets the three listeners its connection adds, has its readable and then its writable
// side closed (what reading the FIN and `tryFinish` do), and is destroyed; the connection's
// `Destroyed` listener takes its listeners off again. The connection is a stand-in that accepts
// the two quiche calls a stream makes here; the `EventAll` listener is marked as a forwarder to an
// object with no listeners, as the real connection's is when nothing listens to stream events.
//
//   npm run bench:quic-stream [-- --streams 100000 --rounds 5]
//
// Prints µs per stream lifecycle per round and their median (allocations: `bench:proxy
// --alloc-profile h3`, on the real request path). Used for docs/decisions.md rows 18-19: the same
// script against node_modules patched before and after a change, interleaved.

import { EventAll, Evented, utils as eventsUtils } from '@matrixai/events';
import Logger, { LogLevel } from '@matrixai/logger';
import { QUICStream, events } from '@matrixai/quic';
import { scriptArgs } from '../lib/bench-args.ts';

const { values } = scriptArgs({
  options: {
    streams: { type: 'string', default: '100000' },
    rounds: { type: 'string', default: '5' },
  },
});
const streams = Number(values.streams);
const rounds = Number(values.rounds);

type Listener = (evt: Event) => void;
interface StreamLike {
  closedP: Promise<void>;
  addEventListener(type: string, listener: Listener, options?: { once: boolean }): void;
  removeEventListener(type: string, listener: Listener): void;
  dispatchEvent(evt: Event): boolean;
  closeRead?: () => void;
  closeWrite?: () => void;
}
interface StreamFactory {
  createQUICStream(opts: Record<string, unknown>): StreamLike;
}

const logger = new Logger('bench', LogLevel.WARN);
const connection = {
  conn: { streamSend: (): number => 0, streamShutdown: (): null => null },
  meta: (): Record<string, never> => ({}),
};
const config = { readableChunkSize: 4096, initialMaxStreamsBidi: 100 };
// What nothing listens to on the connection side: the forwarder's target.
const Quiet = Evented()(class Quiet {});
const onSend: Listener = () => {};
const onAll = eventsUtils.markEventForwarder(() => {}, new Quiet()) as Listener;
let destroyed = 0;
const onDestroyed: Listener = (evt) => {
  const s = evt.target as unknown as StreamLike;
  s.removeEventListener(events.EventQUICStreamSend.name, onSend);
  s.removeEventListener(EventAll.name, onAll);
  destroyed++;
};

async function lifecycle(streamId: number): Promise<void> {
  const s = (QUICStream as unknown as StreamFactory).createQUICStream({ initiated: 'peer', streamId, connection, config, logger });
  s.addEventListener(events.EventQUICStreamSend.name, onSend);
  s.addEventListener(events.EventQUICStreamDestroyed.name, onDestroyed, { once: true });
  s.addEventListener(EventAll.name, onAll);
  // The patched library closes a side by a call; before rows 18-19 by an event to itself.
  if (s.closeRead !== undefined && s.closeWrite !== undefined) {
    s.closeRead();
    s.closeWrite();
  } else {
    s.dispatchEvent(new events.EventQUICStreamCloseRead());
    s.dispatchEvent(new events.EventQUICStreamCloseWrite());
  }
  await s.closedP;
}

const perRound: number[] = [];
for (let r = 0; r < rounds; r++) {
  const start = process.hrtime.bigint();
  // Client-initiated bidirectional stream ids: 0, 4, 8, ...
  for (let i = 0; i < streams; i++) await lifecycle(i * 4);
  await new Promise((resolve) => setImmediate(resolve));
  perRound.push(Number(process.hrtime.bigint() - start) / streams / 1000);
}
if (destroyed !== streams * rounds) throw new Error(`${destroyed} of ${streams * rounds} streams were destroyed`);
const sorted = [...perRound].sort((a, b) => a - b);
console.log(`QUIC stream lifecycle, ${streams} streams per round: ${perRound.map((v) => v.toFixed(2)).join(' / ')} µs per stream (median ${(sorted[Math.floor(sorted.length / 2)] ?? 0).toFixed(2)}); all ${destroyed} destroyed`);
