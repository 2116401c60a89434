// The operator bundle's Prometheus rules (issue 17, Deliver 1), checked with Debian's promtool and
// against the metric catalogue:
// - `promtool check rules` accepts both rule files, with the number of rules the files hold;
// - `promtool test rules` passes every test file, every recording rule and alert is exercised by
//   some test, and the tests can fail (a mutated threshold and a mutated quantile make them fail);
// - every metric a rule reads is in METRIC_CATALOGUE (histograms as _bucket/_sum/_count), a
//   recorded `svc:` series, or `up`;
// - every alert has severity page|ticket, a summary, a description and a runbook_url whose anchor
//   is a heading of docs/operations.md ("Alerts");
// - the nine SLO series of SPEC "Events" are recorded under their exact names.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { load } from 'js-yaml';
import { METRIC_CATALOGUE, SLO_SERIES_NAMES } from '@edge-proxy/telemetry';
import { toolPath } from '../scripts/system-tools.ts';

const root = path.resolve(import.meta.dirname, '..');
const bundle = path.join(root, 'bundle');
const RULE_FILES = ['rules/recording.yaml', 'rules/alerts.yaml'];
const TEST_FILES = readdirSync(path.join(bundle, 'tests'))
  .filter((f) => f.endsWith('.yaml'))
  .sort()
  .map((f) => `tests/${f}`);


interface Rule {
  record?: string;
  alert?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}
interface RuleFile {
  groups: { name: string; rules: Rule[] }[];
}
interface PromtoolTest {
  name?: string;
  alert_rule_test?: { alertname: string }[];
  promql_expr_test?: { expr: string }[];
}
interface TestFile {
  rule_files: string[];
  tests: PromtoolTest[];
}

function readYaml<T>(rel: string): T {
  return load(readFileSync(path.join(bundle, rel), 'utf8')) as T;
}

const rulesByFile = new Map(RULE_FILES.map((f) => [f, readYaml<RuleFile>(f).groups.flatMap((g) => g.rules)]));
const rules = [...rulesByFile.values()].flat();
const records = rules.flatMap((r) => (r.record === undefined ? [] : [r.record]));
const alerts = rules.filter((r): r is Rule & { alert: string } => r.alert !== undefined);
const tests = TEST_FILES.map((f) => readYaml<TestFile>(f).tests).flat();

/** PromQL words that are not metric names (keywords and grouping modifiers). */
const KEYWORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'and', 'or', 'unless', 'offset', 'bool', 'inf', 'nan']);

/**
 * Metric names an expression reads: identifiers that are not functions, keywords, label names or
 * values. Strings, label matchers, ranges and grouping label lists are removed first.
 */
export function metricNames(expr: string): string[] {
  const stripped = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ');
  const names = new Set<string>();
  // Numbers and durations (`0.001`, `1e-3`, `15m`) are matched first so their letters are skipped.
  for (const m of stripped.matchAll(/\d[\w.]*|([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?/g)) {
    const word = m[1];
    if (word === undefined || m[2] !== undefined || KEYWORDS.has(word.toLowerCase())) continue;
    names.add(word);
  }
  return [...names];
}

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to `-`, duplicates numbered. */
export function headingAnchors(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of markdown.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const m = fenced ? null : /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (m === null) continue;
    const base = (m[1] as string)
      .replace(/`/g, '')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

t.test('anchor and metric-name helpers', async (t) => {
  t.same([...headingAnchors('# A `b` c!\n## A b c\n```\n# not a heading\n```\n### SvcFoo (page)\n')], ['a-b-c', 'a-b-c-1', 'svcfoo-page']);
  t.same(metricNames('sum by (le) (rate(x_bucket{outcome="a b"}[5m])) and on () (y > 0) or vector(0) - z offset 15m'), ['x_bucket', 'y', 'z']);
  t.same(metricNames('svc:a:5m > (14.4 * 0.001) and svc:b:1h < 1e-3'), ['svc:a:5m', 'svc:b:1h']);
});

t.test('promtool', async (t) => {
  const promtool = toolPath('promtool');
  if (promtool === undefined) {
    t.fail('promtool is missing: install the Debian package prometheus (scripts/system-tools.ts)');
    return;
  }

  t.test('check rules: both files valid, every rule counted', async (t) => {
    const r = spawnSync(promtool, ['check', 'rules', ...RULE_FILES], { cwd: bundle, encoding: 'utf8' });
    t.equal(r.status, 0, r.stdout + r.stderr);
    for (const [file, list] of rulesByFile) {
      t.match(r.stdout, new RegExp(`Checking ${file}\\n  SUCCESS: ${list.length} rules found`), `${file}: ${list.length} rules`);
    }
  });

  t.test('test rules: every file passes', async (t) => {
    const r = spawnSync(promtool, ['test', 'rules', ...TEST_FILES], { cwd: bundle, encoding: 'utf8' });
    t.equal(r.status, 0, r.stdout + r.stderr);
    const passed = [...r.stdout.matchAll(/Unit Testing: {2}(\S+)\n {2}SUCCESS/g)].map((m) => m[1]);
    t.same(passed, TEST_FILES, 'one SUCCESS per test file');
    const cases = tests.reduce((n, x) => n + (x.alert_rule_test?.length ?? 0) + (x.promql_expr_test?.length ?? 0), 0);
    t.ok(tests.length > 0 && cases > 0, `${tests.length} promtool tests, ${cases} evaluations`);
    t.comment(`promtool ran ${tests.length} tests (${cases} evaluations) in ${TEST_FILES.length} files`);
  });

  // The tests can fail: one threshold of an alert and one quantile of a recording rule changed in a
  // copy of the bundle, and promtool names the rule whose test breaks.
  const mutations = [
    { file: 'rules/alerts.yaml', from: 'svc_downstream_tls_certificate_days_remaining < 7', to: 'svc_downstream_tls_certificate_days_remaining < 6', test: 'tests/alerts-runtime.test.yaml', names: 'SvcDownstreamCertificateExpiryCritical' },
    { file: 'rules/recording.yaml', from: 'histogram_quantile(0.95,', to: 'histogram_quantile(0.9,', test: 'tests/recording.test.yaml', names: 'svc:slo_request_latency_ms:p95_30m' },
  ];
  for (const m of mutations) {
    t.test(`a mutated rule fails its test: ${m.names}`, async (t) => {
      const dir = mkdtempSync(path.join(tmpdir(), 'edge-bundle-'));
      t.teardown(() => rmSync(dir, { recursive: true, force: true }));
      cpSync(bundle, dir, { recursive: true });
      const text = readFileSync(path.join(dir, m.file), 'utf8');
      t.ok(text.includes(m.from), `${m.file} holds ${m.from}`);
      writeFileSync(path.join(dir, m.file), text.replace(m.from, m.to));
      const r = spawnSync(promtool, ['test', 'rules', m.test], { cwd: dir, encoding: 'utf8' });
      t.not(r.status, 0, 'promtool test rules fails');
      t.match(r.stdout + r.stderr, m.names);
    });
  }
});

t.test('every recording rule and alert is exercised by a test', async (t) => {
  const alertnames = new Set(tests.flatMap((x) => (x.alert_rule_test ?? []).map((a) => a.alertname)));
  const exprs = tests.flatMap((x) => (x.promql_expr_test ?? []).map((p) => p.expr));
  for (const a of alerts) t.ok(alertnames.has(a.alert), `alert ${a.alert} tested`);
  for (const name of records) t.ok(exprs.some((e) => metricNames(e).includes(name)), `record ${name} tested`);
  for (const name of alertnames) t.ok(alerts.some((a) => a.alert === name), `tested alert ${name} exists`);
});

t.test('rules read only catalogue metrics, recorded svc: series and up', async (t) => {
  const known = new Set<string>(['up', ...records]);
  for (const m of METRIC_CATALOGUE) {
    if (m.type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) known.add(m.name + s);
    else known.add(m.name);
  }
  for (const r of rules) {
    const name = r.record ?? r.alert ?? '?';
    const read = metricNames(r.expr);
    t.ok(read.length > 0, `${name} reads a metric`);
    for (const metric of read) t.ok(known.has(metric), `${name}: ${metric} is in the catalogue, recorded or up`);
  }
  t.ok(records.every((n) => n.startsWith('svc:')), 'every recorded series is named svc:...');
});

t.test('every alert has a severity, a summary, a description and an existing runbook anchor', async (t) => {
  const doc = readFileSync(path.join(root, 'docs/operations.md'), 'utf8');
  const alertsSection = doc.slice(doc.indexOf('\n## Alerts\n'));
  const anchors = headingAnchors(doc);
  const alertAnchors = headingAnchors(alertsSection);
  t.ok(alerts.length >= 16, `${alerts.length} alerts`);
  t.equal(new Set(alerts.map((a) => a.alert)).size, alerts.length, 'alert names are unique');
  for (const a of alerts) {
    t.match(a.labels?.['severity'] ?? '', /^(page|ticket)$/, `${a.alert}: severity page or ticket`);
    t.ok((a.annotations?.['summary'] ?? '').length > 0, `${a.alert}: summary`);
    t.ok((a.annotations?.['description'] ?? '').length > 0, `${a.alert}: description`);
    const m = /^docs\/operations\.md#(.+)$/.exec(a.annotations?.['runbook_url'] ?? '');
    t.ok(m !== null, `${a.alert}: runbook_url into docs/operations.md`);
    const anchor = m?.[1] ?? '';
    t.ok(anchors.has(anchor), `${a.alert}: anchor #${anchor} exists`);
    t.ok(alertAnchors.has(anchor), `${a.alert}: #${anchor} is under "## Alerts"`);
  }
  // SPEC "Events": the downstream-certificate alert is critical (page) below 7 days.
  const cert = alerts.find((a) => a.labels?.['severity'] === 'page' && a.expr.includes('svc_downstream_tls_certificate_days_remaining'));
  t.match(cert?.expr ?? '', /svc_downstream_tls_certificate_days_remaining < 7$/m, 'a page below 7 days for downstream certificates');
});

t.test('the nine SLO series are recorded under their SPEC names', async (t) => {
  for (const name of SLO_SERIES_NAMES) t.ok(records.includes(name), name);
  t.equal(new Set(records).size, records.length, 'no series recorded twice');
  t.same(
    records.filter((n) => n.startsWith('svc:slo_') && !/:rate(5m|1h|6h)$/.test(n)).sort(),
    [...SLO_SERIES_NAMES].sort(),
    'the svc:slo_ series are the nine and the burn-rate windows'
  );
});
