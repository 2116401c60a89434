// Reading gtlsclient's frame log (ngtcp2 `-n N` runs): per request stream, the time from the first
// STREAM frame sent to the FIN received, in ms (the log's resolution). Shared by the HTTP/3 and
// proxy benchmarks; the soak counts the streams that completed with a 2xx from the same log.

/** Latencies of the request streams, and the span from the first request sent to the last FIN. */
export function streamLatencies(log: string): { latencies: number[]; first: number; last: number } {
  const sent = new Map<string, number>();
  const latencies: number[] = [];
  let first = Infinity;
  let last = 0;
  const re = /^I(\d+) \S+ frm (tx|rx) \d+ 1RTT STREAM\(0x[0-9a-f]+\) id=(0x[0-9a-f]+) fin=(\d)/gm;
  for (const m of log.matchAll(re)) {
    const ms = Number(m[1]);
    const id = m[3] as string;
    if (Number.parseInt(id, 16) % 4 !== 0) continue; // client-initiated bidirectional: requests
    if (m[2] === 'tx' && !sent.has(id)) {
      sent.set(id, ms);
      first = Math.min(first, ms);
    } else if (m[2] === 'rx' && m[4] === '1' && sent.has(id)) {
      latencies.push(ms - (sent.get(id) as number));
      sent.delete(id);
      last = Math.max(last, ms);
    }
  }
  return { latencies, first, last };
}

/**
 * Request streams that completed with a 2xx: a `:status` 2xx header line (`http: stream 0x4
 * [:status: 200]`, id in hex) and a close with H3_NO_ERROR (`HTTP stream 4 closed with error code
 * 256`, id in decimal; RFC 9114 §8.1: 0x100). Needs the debug output (no `-q`); `--no-http-dump`
 * only drops the bodies.
 */
export function okStreams(log: string): number {
  const ok2xx = new Set<number>();
  for (const m of log.matchAll(/^http: stream 0x([0-9a-f]+) \[:status: (\d{3})\]$/gm)) if ((m[2] as string).startsWith('2')) ok2xx.add(Number.parseInt(m[1] as string, 16));
  let n = 0;
  for (const m of log.matchAll(/^HTTP stream (\d+) closed with error code (\d+)$/gm)) if (m[2] === '256' && ok2xx.delete(Number(m[1]))) n++;
  return n;
}
