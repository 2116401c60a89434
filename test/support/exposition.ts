// Reads the Prometheus text exposition of `/metrics` so tests can compare a counter with the number
// of requests or events they made themselves, instead of matching "some digits" (which any value,
// a stuck zero excepted, satisfies).
import http from 'node:http';

/** One sample: metric name, labels as written, value. */
export interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/** Every sample of an exposition (comments and blank lines skipped); throws on a line it cannot read. */
export function parseExposition(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = SAMPLE.exec(line);
    if (m === null) throw new Error(`not an exposition sample: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(LABEL)) labels[l[1] as string] = (l[2] as string).replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    out.push({ name: m[1] as string, labels, value: Number(m[3]) });
  }
  return out;
}

/**
 * The sum of the samples named `name` whose labels include every pair of `labels` (0 when none
 * matches: a counter that was never incremented is not exported).
 */
export function metricValue(text: string, name: string, labels: Readonly<Record<string, string>> = {}): number {
  return parseExposition(text)
    .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

/** `name`'s samples summed by the value of their label `label` (e.g. reason → count; '' when unlabelled). */
export function sumByLabel(samples: readonly Sample[], name: string, label: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const s of samples) {
    if (s.name !== name) continue;
    const k = s.labels[label] ?? '';
    out.set(k, (out.get(k) ?? 0) + s.value);
  }
  return out;
}

/** GET http://127.0.0.1:<port><path> (the metrics endpoint); the body. */
export function scrape(port: number, p = '/metrics'): Promise<string> {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: p, agent: false }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => (res.statusCode === 200 ? resolve(text) : reject(new Error(`GET ${p}: ${res.statusCode}`))));
      })
      .on('error', reject);
  });
}
