// The service most end-to-end tests start with `edge-proxy serve`: one TLS listener, JSON logs at
// info, one upstream `app` (path `/`) with one backend, a metrics endpoint and a control API with
// one bearer token, all on 127.0.0.1. What a test varies (workers, the control API's certificate,
// a `resilience` block...) is a parameter or a YAML block it passes, so the difference stays
// written in the test. Ports come from freePort(): they are written into the file, and workers
// bind the listener port together with SO_REUSEPORT (port 0 would give each its own).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../../scripts/lib/certs.ts';
import type { CertFiles } from '../../scripts/lib/certs.ts';
import { freePort } from '../../scripts/lib/free-port.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** A service's listener (`l`), control API (`c`) and metrics (`m`) ports. */
export interface ServicePorts {
  readonly l: number;
  readonly c: number;
  readonly m: number;
}

/** Three distinct ports from freePort(): listener, control API, metrics. */
export async function freePorts(): Promise<ServicePorts> {
  // freePort() checks that a port is free, it does not reserve it: two calls can draw the same
  // one (seen: the metrics port equal to the control API's, EDGE_CONFIG_BIND_CONFLICT).
  const ports = new Set<number>();
  while (ports.size < 3) ports.add(await freePort());
  const [l, c, m] = [...ports] as [number, number, number];
  return { l, c, m };
}

/** A temp dir removed at teardown; in `<dir>/ca` a CA and a server certificate for localhost and 127.0.0.1. */
export function serviceFiles(t: Teardown, prefix: string): { dir: string; ca: CertFiles; leaf: CertFiles; caPem: Buffer } {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const ca = makeCa(path.join(dir, 'ca'));
  const leaf = makeLeaf(path.join(dir, 'ca'), 'server', ca, { sans: ['localhost', '127.0.0.1'] });
  return { dir, ca, leaf, caPem: readFileSync(ca.cert) };
}

export interface ServiceConfig {
  readonly ports: ServicePorts;
  /** The listener's certificate and key. */
  readonly cert: CertFiles;
  /** Port on 127.0.0.1 of `app`'s one backend (`b`); unused when `upstream` is given. */
  readonly backendPort?: number;
  /** The value of `upstream` (a YAML flow map of pools); none: `app` (path `/`) with its one backend on `backendPort`. */
  readonly upstream?: string;
  /** The control API's one bearer token, its role and `actor_id`. */
  readonly token: { readonly token: string; readonly role: 'viewer' | 'operator' | 'admin'; readonly actor: string };
  /** The entries of `performance`, e.g. `worker_threads: 2`; none: no `performance` key. */
  readonly performance?: string;
  /** More entries of `log` after `format: json, level: info`, e.g. `file: "/var/log/x.log"`. */
  readonly log?: string;
  /** `control_api.tls`; none: the control API has no `tls` key. */
  readonly controlApiTls?: CertFiles;
  /** More top-level YAML (e.g. `resilience: { ... }`), placed after `upstream`. */
  readonly extra?: string;
  /** More lines of `control_api`, indented four spaces, each ending in a newline; placed last. */
  readonly controlApiExtra?: string;
  /** More entries of `observability` (e.g. `access_log: { enabled: true }`), indented two spaces, each ending in a newline; placed first. */
  readonly observability?: string;
}

/** The YAML of that service; it ends with a newline, so more top-level keys can be appended. */
export function serviceConfig(o: ServiceConfig): string {
  const performance = o.performance === undefined ? '' : `performance: { ${o.performance} }\n`;
  const extra = o.extra === undefined ? '' : `${o.extra}\n`;
  const upstream = o.upstream ?? `{ app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${o.backendPort}" }] } }`;
  const controlApiTls = o.controlApiTls === undefined ? '' : `    tls: { cert: ${o.controlApiTls.cert}, key: ${o.controlApiTls.key} }\n`;
  return `
listen: { address: 127.0.0.1, port: ${o.ports.l}, tls: { cert: ${o.cert.cert}, key: ${o.cert.key} } }
log: { format: json, level: info${o.log === undefined ? '' : `, ${o.log}`} }
${performance}upstream: ${upstream}
${extra}observability:
${o.observability ?? ''}  metrics: { address: 127.0.0.1, port: ${o.ports.m} }
  control_api:
    address: 127.0.0.1
    port: ${o.ports.c}
${controlApiTls}    auth: { bearer_tokens: [{ token: ${o.token.token}, role: ${o.token.role}, actor_id: ${o.token.actor} }] }
${o.controlApiExtra ?? ''}`;
}
