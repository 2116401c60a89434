// Starts the ingresses of every listener of a resolved configuration on a Dataplane: per listener
// a QUIC server (UDP) and a TLS bootstrap server (TCP) on the same port number. Used by the
// worker process; the supervisor (control plane) hands it generations.
import type { NormalizedListener, ResolvedConfig } from '@edge-proxy/config';
import type { Metrics } from '@edge-proxy/telemetry';
import { BootstrapIngress } from '../ingress/bootstrap.ts';
import { QuicIngress } from '../ingress/quic.ts';
import { downstreamTimeouts } from '../ingress/connection-deadlines.ts';
import { RefusalLog } from '../ingress/refusal-log.ts';
import type { Dataplane } from '../runtime/dataplane.ts';
import type { SharedKeys } from '@edge-proxy/ipc';

/** Port-0 binds (tests) tried before a TCP collision on the UDP-chosen port is given up. */
const PORT_ZERO_ATTEMPTS = 10;

/** The sockets of one listener. */
export interface ListenerHandle {
  readonly name: string;
  readonly quic: QuicIngress;
  readonly bootstrap: BootstrapIngress;
  readonly udpPort: number;
  readonly tcpPort: number;
}

/** Code of a listener that a worker could not bind (SERVICE_ERROR_CODES). */
export const LISTENER_BIND_FAILED = 'EDGE_LISTENER_BIND_FAILED';

/** The error of a listener that could not be bound, coded and naming the listener and its address. */
export function bindError(listener: NormalizedListener, err: unknown): Error {
  const e = err as NodeJS.ErrnoException;
  const why = typeof e?.code === 'string' ? e.code : err instanceof Error ? err.message : String(err);
  return Object.assign(new Error(`listener ${listener.name} (${listener.address}:${listener.port}) could not be bound: ${why}`), { code: LISTENER_BIND_FAILED });
}

/**
 * Binds every listener. `portOverride` (tests) replaces each configured port; 0 picks a free one,
 * and then the TCP port follows the UDP port so that Alt-Svc stays true.
 */
export function serveListeners(resolved: ResolvedConfig, dataplane: Dataplane, metrics: Metrics, keys: SharedKeys, portOverride?: number): Promise<ListenerHandle[]> {
  return bindListeners(resolved.config.listeners, resolved, dataplane, metrics, keys, portOverride);
}

/**
 * Binds the listeners of `resolved` not in `bound` (names): those an activation added. All or
 * none: a listener that cannot be bound closes the ones bound before it and rejects with
 * EDGE_LISTENER_BIND_FAILED.
 */
export async function serveAddedListeners(resolved: ResolvedConfig, bound: ReadonlySet<string>, dataplane: Dataplane, metrics: Metrics, keys: SharedKeys): Promise<ListenerHandle[]> {
  const added = resolved.config.listeners.filter((l) => !bound.has(l.name));
  if (added.length === 0) return [];
  return bindListeners(added, resolved, dataplane, metrics, keys, undefined, true);
}

async function bindListeners(listeners: readonly NormalizedListener[], resolved: ResolvedConfig, dataplane: Dataplane, metrics: Metrics, keys: SharedKeys, portOverride: number | undefined, coded = false): Promise<ListenerHandle[]> {
  const out: ListenerHandle[] = [];
  const c = resolved.config;
  // The active generation's timeouts for each new connection (live), these until one is active.
  const timeouts = () => downstreamTimeouts((dataplane.current?.config ?? c).performance.timeouts);
  const refusals = new RefusalLog(dataplane.deps.log);
  try {
    for (const listener of listeners) {
      const material = resolved.material.listeners[listener.name];
      if (material === undefined) throw new Error(`no TLS material for listener ${listener.name}`);
      // With port 0 the kernel picks the UDP port; the same number may already be taken on TCP
      // (another socket's ephemeral port), so a pair is tried again on another port.
      const attempts = portOverride === 0 ? PORT_ZERO_ATTEMPTS : 1;
      for (let attempt = 1; ; attempt++) {
        const quic = new QuicIngress({
          listener,
          material,
          runtimes: dataplane,
          metrics,
          cryptoKey: keys.cryptoKey,
          ticketKey: keys.ticketKey,
          idleTimeoutMs: c.performance.timeouts.quic_idle_ms,
          allow0rtt: c.resilience.protocol.allow_0rtt,
          maxFieldSectionSize: c.resilience.protocol.max_headers_bytes,
          admission: dataplane.connections,
          refusals,
          clientIdleMs: () => timeouts().idleMs,
          counters: dataplane.quicCounters,
          reusePort: c.performance.reuseport,
          ...(portOverride === undefined ? {} : { bindPort: portOverride }),
        });
        let udpPort: number;
        try {
          udpPort = await quic.listen();
        } catch (err) {
          // The QUIC library's bind error names neither the port nor the protocol: the operator needs both.
          throw coded ? bindError(listener, err) : new Error(`listener ${listener.name}: QUIC bind on UDP ${listener.address}:${portOverride ?? listener.port}: ${err instanceof Error ? err.message : String(err)}`);
        }
        const effective = portOverride === undefined ? listener : { ...listener, port: udpPort };
        const bootstrap = new BootstrapIngress({ listener: effective, material, runtimes: dataplane, metrics, admission: dataplane.connections, refusals, timeouts, reusePort: c.performance.reuseport, ...(portOverride === undefined ? {} : { bindPort: udpPort }) });
        let tcpPort: number;
        try {
          tcpPort = await bootstrap.listen();
        } catch (err) {
          await quic.close(0);
          if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE' && attempt < attempts) continue;
          throw coded ? bindError(listener, err) : err;
        }
        out.push({ name: listener.name, quic, bootstrap, udpPort, tcpPort });
        break;
      }
    }
  } catch (err) {
    await Promise.all(out.map((h) => Promise.all([h.quic.close(0), h.bootstrap.close()])));
    throw err;
  }
  return out;
}
