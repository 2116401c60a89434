// A child process for the channel test: answers `echo` with its payload, `slow` never, `fail` with
// a coded refusal; exits on `exit`.
import { serveRequests } from '../src/channel.ts';

process.on('message', (m: unknown) => {
  if ((m as { type?: string }).type === 'exit') process.exit(0);
});
serveRequests(
  process as unknown as Parameters<typeof serveRequests>[0],
  async (m) => {
    const msg = m as unknown as { type: string; payload?: unknown };
    if (msg.type === 'echo') return msg.payload;
    if (msg.type === 'fail') throw Object.assign(new Error('cannot prepare'), { code: 'EDGE_PREPARE_FAILED' });
    return new Promise(() => {}); // slow: never answers
  },
  () => true,
);
process.send?.({ type: 'ready', pid: process.pid });
