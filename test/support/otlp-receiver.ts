// A small OTLP/HTTP traces collector for tests: a real HTTP server on 127.0.0.1 (port 0) that
// accepts `POST /v1/traces` with the OTLP JSON encoding (gzip too, should an exporter compress),
// decodes `resourceSpans[].scopeSpans[].spans[]` into plain spans, and lets a test await spans by
// an event, never by sleeping. Written from the OTLP specification (opentelemetry-proto
// `trace/v1/trace.proto` and its JSON mapping: ids are hex strings there, not base64 as in the
// protobuf JSON mapping; both are accepted and turned into lower-case hex), independently of the
// SDK the proxy uses.
import { EventEmitter, once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gunzipSync } from 'node:zlib';

/** One span as the collector received it. */
export interface ReceivedSpan {
  readonly traceId: string;
  readonly spanId: string;
  /** Undefined for a root span. */
  readonly parentSpanId: string | undefined;
  readonly name: string;
  /** OTLP `SpanKind`: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  readonly kind: number;
  readonly attributes: Record<string, string | number | boolean>;
  /** OTLP `Status`: code 0 unset, 1 ok, 2 error. */
  readonly status: { readonly code: number; readonly message: string | undefined };
  /** The resource attributes of the batch the span came in. */
  readonly resource: Record<string, string | number | boolean>;
}

export const SPAN_KIND = { server: 2, client: 3 } as const;
export const STATUS_ERROR = 2;

export interface OtlpReceiver {
  /** `http://127.0.0.1:<port>/v1/traces` */
  readonly url: string;
  /** Every span received so far, in arrival order. */
  readonly spans: ReceivedSpan[];
  /** Export requests received (with their content encoding). */
  readonly requests: { readonly contentType: string; readonly contentEncoding: string | undefined; readonly headers: Readonly<Record<string, string | string[] | undefined>> }[];
  /** Resolves once at least `n` spans matching `filter` arrived (rejects after `timeoutMs`, listing what did). */
  waitForSpans(n: number, filter?: (s: ReceivedSpan) => boolean, timeoutMs?: number): Promise<ReceivedSpan[]>;
  /** The HTTP status answered to export requests from now on (200 by default). */
  answer(status: number): void;
  /** Holds every answer (the exporter waits) until the returned function is called. */
  hold(): () => void;
  close(): Promise<void>;
}

type AnyValue = { stringValue?: string; intValue?: string | number; doubleValue?: number; boolValue?: boolean; [k: string]: unknown };
type KeyValue = { key: string; value?: AnyValue };

function value(v: AnyValue | undefined): string | number | boolean {
  if (v === undefined) return '';
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.boolValue !== undefined) return v.boolValue;
  return JSON.stringify(v);
}

function attributes(kvs: readonly KeyValue[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const kv of kvs ?? []) out[kv.key] = value(kv.value);
  return out;
}

/** An OTLP JSON id (hex per the OTLP JSON mapping, or base64) as lower-case hex; undefined when empty. */
export function otlpId(id: unknown, bytes: number): string | undefined {
  if (typeof id !== 'string' || id === '') return undefined;
  if (new RegExp(`^[0-9a-fA-F]{${bytes * 2}}$`).test(id)) return id.toLowerCase();
  const hex = Buffer.from(id, 'base64').toString('hex');
  return hex.length === bytes * 2 ? hex : undefined;
}

interface ExportBody {
  resourceSpans?: { resource?: { attributes?: KeyValue[] }; scopeSpans?: { spans?: Record<string, unknown>[] }[] }[];
}

function decode(body: ExportBody): ReceivedSpan[] {
  const out: ReceivedSpan[] = [];
  for (const rs of body.resourceSpans ?? []) {
    const resource = attributes(rs.resource?.attributes);
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        const status = (s['status'] ?? {}) as { code?: number; message?: string };
        out.push({
          traceId: otlpId(s['traceId'], 16) ?? '',
          spanId: otlpId(s['spanId'], 8) ?? '',
          parentSpanId: otlpId(s['parentSpanId'], 8),
          name: String(s['name']),
          kind: Number(s['kind'] ?? 0),
          attributes: attributes(s['attributes'] as KeyValue[] | undefined),
          status: { code: Number(status.code ?? 0), message: status.message === '' ? undefined : status.message },
          resource,
        });
      }
    }
  }
  return out;
}

/** Starts a collector on 127.0.0.1, port 0. */
export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const requests: OtlpReceiver['requests'][number][] = [];
  const arrived = new EventEmitter();
  let status = 200;
  let held: (() => void)[] | undefined;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/v1/traces') {
        res.writeHead(404).end();
        return;
      }
      const encoding = req.headers['content-encoding'];
      requests.push({ contentType: req.headers['content-type'] ?? '', contentEncoding: encoding, headers: req.headers });
      if (held !== undefined) {
        held.push(() => respond());
        return;
      }
      respond();
    });
    const respond = (): void => {
      if (status !== 200) {
        res.writeHead(status, { 'content-type': 'application/json' }).end('{}');
        return;
      }
      const encoding = req.headers['content-encoding'];
      let raw = Buffer.concat(chunks);
      try {
        if (encoding === 'gzip') raw = gunzipSync(raw);
        const got = decode(JSON.parse(raw.toString('utf8')) as ExportBody);
        spans.push(...got);
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
        arrived.emit('spans');
      } catch {
        res.writeHead(400).end();
      }
    };
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1/traces`,
    spans,
    requests,
    answer(s) {
      status = s;
    },
    hold() {
      const list: (() => void)[] = [];
      held = list;
      return () => {
        if (held === list) held = undefined;
        for (const r of list.splice(0)) r();
      };
    },
    async waitForSpans(n, filter = () => true, timeoutMs = 10_000) {
      const matching = (): ReceivedSpan[] => spans.filter(filter);
      if (matching().length >= n) return matching();
      return new Promise((resolve, reject) => {
        const check = (): void => {
          if (matching().length < n) return;
          clearTimeout(timer);
          arrived.off('spans', check);
          resolve(matching());
        };
        const timer = setTimeout(() => {
          arrived.off('spans', check);
          reject(new Error(`${matching().length} of ${n} spans arrived in ${timeoutMs} ms; received: ${JSON.stringify(spans.map((s) => [s.name, s.kind, s.traceId, s.spanId]))}`));
        }, timeoutMs);
        arrived.on('spans', check);
      });
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
