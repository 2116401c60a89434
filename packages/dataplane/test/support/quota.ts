// Quota test helpers: a generation's quota settings built directly (validation refuses enabling
// quota until the pipeline exists), request facts, a promise around `check`, counter values.
import type { Metrics } from '@edge-proxy/telemetry';
import type { QuotaConfig, QuotaRequestFacts, QuotaSettings, QuotaVerdict, CompiledPolicy, QuotaControl } from '../../src/resilience/quota/index.ts';

type Policy = QuotaConfig['policies'][number];

export function policy(name: string, o: Partial<Policy> = {}): Policy {
  return { name, routes: [], dimensions: ['header:x-tenant'], key_fallback: 'client_ip', max_keys_per_window: 100_000, max_new_keys_per_source: 100, sustained: { limit: 10, window_ms: 3_600_000 }, ...o };
}

/**
 * Resolves at once unless less than `spanMs` is left in the current fixed window of `windowMs`
 * (windows start at multiples of `windowMs` since the epoch, in Redis's script and in the local
 * counters alike); then once the next window has begun. A test that counts against one
 * window with the real clock calls it first, so the window cannot end in the middle of the test:
 * at hh:59:59 the hour's sustained counts start again and "10 of 30 allowed" becomes 11 or more.
 * It waits at most `spanMs`, and only that close to an edge (15 s of each hour).
 */
export async function clearOfWindowEnd(windowMs = 3_600_000, spanMs = 15_000): Promise<void> {
  const left = windowMs - (Date.now() % windowMs);
  if (left < spanMs) await new Promise((r) => setTimeout(r, left + 10));
}

export function quotaSettings(o: Partial<QuotaConfig> & { address?: string; timeoutMs?: number }): QuotaSettings {
  const { address, timeoutMs, ...rest } = o;
  const quota: QuotaConfig = {
    enabled: true,
    backend: 'redis',
    redis: { address: address ?? '127.0.0.1:1', key_prefix: 'edge-proxy:quota:', timeout_ms: timeoutMs ?? 50 },
    failure_mode: 'local_fallback',
    policies: [policy('tenant')],
    ...rest,
  };
  return { resilience: { quota } };
}

export function facts(headers: Record<string, string> = {}, o: Partial<Omit<QuotaRequestFacts, 'header'>> = {}): QuotaRequestFacts {
  const lower = new Map(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
  return { clientIp: '192.0.2.1', host: 'api.example', route: 'api', path: '/v1/items', ...o, header: (n) => lower.get(n) };
}

export function check(q: QuotaControl, policies: readonly CompiledPolicy[], f: QuotaRequestFacts): Promise<QuotaVerdict> {
  return new Promise((resolve) => q.check(policies, f, resolve));
}

/** The value of counter `name`'s series whose labels include `labels` (summed), 0 when none. */
export async function counterValue(metrics: Metrics, name: string, labels: Record<string, string>): Promise<number> {
  const got = await metrics.counter(name).get();
  let sum = 0;
  for (const v of got.values) if (Object.entries(labels).every(([k, x]) => v.labels[k] === x)) sum += v.value;
  return sum;
}
