// The operator bundle's dashboards (issue 17, SPEC "Events": operator bundle; "Versioning" 5):
// exactly the six files the runtime snapshot advertises, each with its stable uid, an explicit
// version, a datasource variable every panel uses, and expressions that name only metrics the
// catalogue exposes (or the SLO / recorded series of bundle/rules/recording.yaml) with only the
// labels the catalogue declares for them.
import t from 'tap';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { load } from 'js-yaml';
import { METRIC_CATALOGUE, SLO_SERIES_NAMES } from '@edge-proxy/telemetry';
import { DASHBOARD_PACKAGES } from '@edge-proxy/controlplane';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const dashboardsDir = path.join(root, 'bundle/dashboards');

/** file → uid. A uid never changes (imports must keep it): changing one here is a breaking change. */
const EXPECTED_UIDS: Readonly<Record<string, string>> = {
  'edge-traffic.json': 'edge-proxy-edge-traffic',
  'admission-overload.json': 'edge-proxy-admission-overload',
  'backend-health.json': 'edge-proxy-backend-health',
  'retries-hedges.json': 'edge-proxy-retries-hedges',
  'tls-certificates.json': 'edge-proxy-tls-certificates',
  'control-plane.json': 'edge-proxy-control-plane',
};


/** Labels Prometheus attaches to every scraped series (not declared by the catalogue). */
const TARGET_LABELS = ['job', 'instance'];

/** Series names in the exposition and their labels: histograms as _bucket (with `le`), _sum, _count. */
function exposedSeries(): Map<string, ReadonlySet<string>> {
  const out = new Map<string, ReadonlySet<string>>();
  for (const m of METRIC_CATALOGUE) {
    const labels = [...m.labels, ...TARGET_LABELS];
    if (m.type === 'histogram') {
      out.set(`${m.name}_bucket`, new Set([...labels, 'le']));
      out.set(`${m.name}_sum`, new Set(labels));
      out.set(`${m.name}_count`, new Set(labels));
    } else out.set(m.name, new Set(labels));
  }
  return out;
}

/** Series recorded by bundle/rules/recording.yaml, when the file exists. */
function recordedSeries(): string[] {
  const file = path.join(root, 'bundle/rules/recording.yaml');
  if (!existsSync(file)) return [];
  const doc = load(readFileSync(file, 'utf8')) as { groups?: { rules?: { record?: unknown }[] }[] } | null;
  return (doc?.groups ?? []).flatMap((g) => (g.rules ?? []).flatMap((r) => (typeof r.record === 'string' ? [r.record] : [])));
}

const AGGREGATIONS = new Set(['sum', 'min', 'max', 'avg', 'group', 'stddev', 'stdvar', 'count', 'count_values', 'bottomk', 'topk', 'quantile', 'limitk', 'limit_ratio']);
const FUNCTIONS = new Set([
  'abs', 'absent', 'absent_over_time', 'avg_over_time', 'ceil', 'changes', 'clamp', 'clamp_max', 'clamp_min', 'count_over_time', 'day_of_month', 'day_of_week', 'days_in_month', 'delta', 'deriv',
  'exp', 'floor', 'histogram_quantile', 'holt_winters', 'hour', 'idelta', 'increase', 'irate', 'label_join', 'label_replace', 'last_over_time', 'ln', 'log10', 'log2', 'max_over_time',
  'min_over_time', 'minute', 'month', 'predict_linear', 'present_over_time', 'quantile_over_time', 'rate', 'resets', 'round', 'scalar', 'sgn', 'sort', 'sort_desc', 'sqrt',
  'stddev_over_time', 'stdvar_over_time', 'sum_over_time', 'time', 'timestamp', 'vector', 'year',
]);
const BINARY_KEYWORDS = new Set(['and', 'or', 'unless', 'bool']);
const UNSUPPORTED_KEYWORDS = new Set(['on', 'ignoring', 'group_left', 'group_right', 'offset', '@']);

interface Token {
  readonly kind: 'ident' | 'string' | 'range' | '{' | '}' | '(' | ')' | ',' | 'op' | 'number' | 'variable';
  readonly text: string;
}

/** Splits a PromQL expression (with Grafana `$variables`) into tokens; throws on a character it does not know. */
function tokenize(expr: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  while (i < expr.length) {
    const ch = expr.charAt(i);
    const rest = expr.slice(i);
    let m: RegExpMatchArray | null;
    if (/\s/.test(ch)) i++;
    else if (ch === '"' || ch === "'" || ch === '`') {
      let j = i + 1;
      while (j < expr.length && expr.charAt(j) !== ch) j += expr.charAt(j) === '\\' && ch !== '`' ? 2 : 1;
      if (j >= expr.length) throw new Error(`unterminated string at ${i}`);
      tokens.push({ kind: 'string', text: expr.slice(i + 1, j) });
      i = j + 1;
    } else if (ch === '[') {
      const j = expr.indexOf(']', i);
      if (j < 0) throw new Error(`unterminated range at ${i}`);
      tokens.push({ kind: 'range', text: expr.slice(i + 1, j) });
      i = j + 1;
    } else if ('{}(),'.includes(ch)) {
      tokens.push({ kind: ch as Token['kind'], text: ch });
      i++;
    } else if ((m = rest.match(/^\$(\{[^}]*\}|\w+)/)) !== null) {
      tokens.push({ kind: 'variable', text: m[0] });
      i += m[0].length;
    } else if ((m = rest.match(/^[A-Za-z_:][A-Za-z0-9_:]*/)) !== null) {
      tokens.push({ kind: 'ident', text: m[0] });
      i += m[0].length;
    } else if ((m = rest.match(/^(0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+([eE][+-]?[0-9]+)?)/)) !== null) {
      tokens.push({ kind: 'number', text: m[0] });
      i += m[0].length;
    } else if ((m = rest.match(/^(=~|!~|!=|==|>=|<=|[=<>+\-*/%^@])/)) !== null) {
      tokens.push({ kind: m[0] === '@' ? 'ident' : 'op', text: m[0] });
      i += m[0].length;
    } else throw new Error(`unexpected ${JSON.stringify(ch)} at ${i}`);
  }
  return tokens;
}

/** One use of a series in an expression: its name and the labels its matchers name. */
interface SeriesUse {
  readonly name: string;
  readonly matchers: readonly string[];
}

/**
 * Finds every series an expression selects and checks it, and the labels used with it, against
 * `known` (series name → labels; `null` for a recorded series whose labels are not checked).
 *
 * A small tokenizer, not a PromQL parser. An identifier is a function or aggregation when `(`
 * follows it (one outside the known lists is a problem), a keyword (`by`, `without`, `and`, `or`,
 * `unless`, `bool`, `inf`, `nan`), or else a series name: so a made-up metric name, bare or followed
 * by `{`, `[` or anything else, is reported. Label names are checked in `{...}` matchers (against
 * the series they select) and in `by (...)`/`without (...)` of an aggregation, prefix or postfix
 * form (each label must be declared by every catalogue series inside the aggregation).
 * Limits: an inner aggregation that drops a label is not seen (`sum by (a) (sum by (b) (x))`
 * passes if `x` declares `a`); labels of recorded series are not checked; vector matching
 * (`on`, `ignoring`, `group_left`, `group_right`) and `offset`/`@` are refused rather than half
 * checked; subqueries' `[range:step]` are skipped like ranges.
 */
function checkExpr(expr: string, known: ReadonlyMap<string, ReadonlySet<string> | null>): { uses: SeriesUse[]; problems: string[] } {
  const uses: SeriesUse[] = [];
  const problems: string[] = [];
  let tokens: Token[];
  try {
    tokens = tokenize(expr);
  } catch (err) {
    return { uses, problems: [(err as Error).message] };
  }
  interface Frame {
    readonly series: string[];
    group: readonly string[] | null;
  }
  const frames: Frame[] = [];
  let lastClosed: Frame | null = null;
  let pendingGroup: readonly string[] | null = null;
  const labelList = (at: number): { labels: string[]; next: number } => {
    if (tokens[at]?.kind !== '(') throw new Error(`expected ( after ${tokens[at - 1]?.text ?? ''}`);
    const labels: string[] = [];
    let j = at + 1;
    for (; j < tokens.length && tokens[j]?.kind !== ')'; j++) {
      const tok = tokens[j];
      if (tok?.kind === 'ident') labels.push(tok.text);
      else if (tok?.kind !== ',') throw new Error(`unexpected ${tok?.text ?? ''} in a label list`);
    }
    return { labels, next: j + 1 };
  };
  const checkGroup = (frame: Frame): void => {
    for (const label of frame.group ?? []) {
      for (const name of frame.series) {
        const labels = known.get(name);
        if (labels !== null && labels !== undefined && !labels.has(label)) problems.push(`label ${label} (by/without) is not declared for ${name}`);
      }
    }
  };
  const select = (name: string, matchers: string[]): void => {
    uses.push({ name, matchers });
    for (const f of frames) f.series.push(name);
    const labels = known.get(name);
    if (labels === undefined) problems.push(`unknown series ${name}`);
    else if (labels !== null) for (const l of matchers) if (!labels.has(l)) problems.push(`label ${l} is not declared for ${name}`);
  };
  const matcherBlock = (at: number): { matchers: string[]; name: string | null; next: number } => {
    const matchers: string[] = [];
    let name: string | null = null;
    let j = at + 1;
    while (j < tokens.length && tokens[j]?.kind !== '}') {
      const [label, op, value] = [tokens[j], tokens[j + 1], tokens[j + 2]];
      if (label?.kind !== 'ident' || op?.kind !== 'op' || value?.kind !== 'string') throw new Error(`malformed label matcher at ${label?.text ?? 'end'}`);
      if (label.text === '__name__' && op.text === '=') name = value.text;
      else matchers.push(label.text);
      j += 3;
      if (tokens[j]?.kind === ',') j++;
    }
    if (j >= tokens.length) throw new Error('unterminated label matchers');
    return { matchers, name, next: j + 1 };
  };
  try {
    let i = 0;
    while (i < tokens.length) {
      const tok = tokens[i] as Token;
      const next = tokens[i + 1];
      if (tok.kind === 'ident') {
        if (tok.text === 'by' || tok.text === 'without') {
          const { labels, next: after } = labelList(i + 1);
          if (tokens[i - 1]?.kind === ')' && lastClosed !== null && lastClosed.group === null) {
            lastClosed.group = labels;
            checkGroup(lastClosed);
          } else if (tokens[i - 1]?.kind === 'ident' && AGGREGATIONS.has(tokens[i - 1]?.text ?? '')) pendingGroup = labels;
          else throw new Error(`${tok.text} not after an aggregation`);
          i = after;
          continue;
        }
        if (UNSUPPORTED_KEYWORDS.has(tok.text)) throw new Error(`${tok.text} is not supported by this checker`);
        if (BINARY_KEYWORDS.has(tok.text) || tok.text === 'inf' || tok.text === 'nan') {
          i++;
          continue;
        }
        if (next?.kind === '(' || (AGGREGATIONS.has(tok.text) && (next?.text === 'by' || next?.text === 'without'))) {
          if (!FUNCTIONS.has(tok.text) && !AGGREGATIONS.has(tok.text)) problems.push(`unknown function ${tok.text}`);
          i++;
          continue;
        }
        if (next?.kind === '{') {
          const block = matcherBlock(i + 1);
          select(tok.text, block.matchers);
          i = block.next;
        } else {
          select(tok.text, []);
          i++;
        }
        continue;
      }
      if (tok.kind === '{') {
        const block = matcherBlock(i);
        if (block.name === null) throw new Error('a selector without a metric name');
        select(block.name, block.matchers);
        i = block.next;
        continue;
      }
      if (tok.kind === '(') {
        frames.push({ series: [], group: pendingGroup });
        pendingGroup = null;
      } else if (tok.kind === ')') {
        const frame = frames.pop();
        if (frame === undefined) throw new Error('unbalanced )');
        checkGroup(frame);
        lastClosed = frame;
      } else if (tok.kind === '}') throw new Error('unbalanced }');
      i++;
    }
    if (frames.length > 0) throw new Error('unbalanced (');
  } catch (err) {
    problems.push((err as Error).message);
  }
  return { uses, problems };
}

function knownSeries(): Map<string, ReadonlySet<string> | null> {
  const known = new Map<string, ReadonlySet<string> | null>(exposedSeries());
  for (const name of [...SLO_SERIES_NAMES, ...recordedSeries()]) if (!known.has(name)) known.set(name, null);
  return known;
}

t.test('the expression checker', async (t) => {
  const known = knownSeries();
  const ok = (expr: string, names: string[]): void => {
    const r = checkExpr(expr, known);
    t.same(r.problems, [], expr);
    t.same(r.uses.map((u) => u.name), names, `series in ${expr}`);
  };
  const bad = (expr: string, problem: RegExp): void => {
    const r = checkExpr(expr, known);
    t.ok(r.problems.some((p) => problem.test(p)), `${expr}: ${r.problems.join('; ') || 'no problem found'}`);
  };
  ok('sum by (status_class) (rate(svc_upstream_requests_total{job=~"$job", outcome!="success"}[$__rate_interval]))', ['svc_upstream_requests_total']);
  ok('histogram_quantile(0.99, sum by (upstream, le) (rate(svc_upstream_request_latency_ms_bucket{upstream=~"$upstream"}[5m])))', ['svc_upstream_request_latency_ms_bucket']);
  ok('sum(rate(svc_overload_shed[5m])) by (instance) / sum(rate(svc_requests_total[5m]))', ['svc_overload_shed', 'svc_requests_total']);
  ok('count(max by (upstream, backend) (svc_circuit_breaker_state) == 2) or vector(0)', ['svc_circuit_breaker_state']);
  ok('{__name__="svc_active_connections", instance="a:1"}', ['svc_active_connections']);
  ok('svc:slo_availability_ratio:30m', ['svc:slo_availability_ratio:30m']);
  ok('svc_requests_total{job="svc_made_up_total"}', ['svc_requests_total']);
  // A made-up metric fails however it is written.
  bad('sum(rate(svc_made_up_total{job=~"$job"}[5m]))', /unknown series svc_made_up_total/);
  bad('sum(rate(svc_made_up_total[5m]))', /unknown series svc_made_up_total/);
  bad('svc_made_up_total', /unknown series svc_made_up_total/);
  bad('svc_requests_total / svc_made_up_total', /unknown series svc_made_up_total/);
  bad('{__name__="svc_made_up_total"}', /unknown series svc_made_up_total/);
  bad('svc:slo_made_up_ratio:30m', /unknown series svc:slo_made_up_ratio:30m/);
  bad('svc_upstream_request_latency_ms', /unknown series svc_upstream_request_latency_ms$/);
  bad('svc_requests_total_bucket', /unknown series/);
  // Labels the catalogue does not declare for that metric.
  bad('svc_requests_total{upstream="a"}', /label upstream is not declared for svc_requests_total/);
  bad('sum by (backend) (rate(svc_upstream_requests_total[5m]))', /label backend \(by\/without\) is not declared for svc_upstream_requests_total/);
  bad('sum(rate(svc_upstream_requests_total[5m])) without (route)', /label route/);
  bad('sum by (le) (rate(svc_upstream_request_latency_ms_count[5m]))', /label le/);
  bad('made_up_function(svc_requests_total)', /unknown function made_up_function/);
  bad('svc_requests_total offset 5m', /offset is not supported/);
  bad('sum(svc_requests_total', /unbalanced/);
});

function readDashboard(file: string): Record<string, unknown> {
  return JSON.parse(readFileSync(path.join(dashboardsDir, file), 'utf8')) as Record<string, unknown>;
}

type Panel = Record<string, unknown> & { type?: unknown; panels?: Panel[]; targets?: Record<string, unknown>[] };

/** Every panel, rows' nested (collapsed) panels included; rows themselves are not returned. */
function panelsOf(panels: Panel[]): Panel[] {
  return panels.flatMap((p) => (p.type === 'row' ? panelsOf(p.panels ?? []) : [p]));
}

const usesDatasourceVariable = (ds: unknown): boolean => ds === '${datasource}' || (typeof ds === 'object' && ds !== null && (ds as { uid?: unknown }).uid === '${datasource}');

t.test('bundle/dashboards holds exactly the six dashboards, and the snapshot advertises them', async (t) => {
  const onDisk = readdirSync(dashboardsDir).filter((f) => f.endsWith('.json')).sort();
  t.same(onDisk, Object.keys(EXPECTED_UIDS).sort());
  t.same([...DASHBOARD_PACKAGES].sort(), onDisk.map((f) => `bundle/dashboards/${f}`));
  for (const p of DASHBOARD_PACKAGES) t.ok(existsSync(path.join(root, p)), `${p} exists`);
  t.equal(new Set(Object.values(EXPECTED_UIDS)).size, 6, 'uids unique');
});

const known = knownSeries();
for (const [file, uid] of Object.entries(EXPECTED_UIDS)) {
  t.test(file, async (t) => {
    const d = readDashboard(file);
    t.equal(d.uid, uid, 'stable uid');
    t.ok(Number.isInteger(d.version) && (d.version as number) >= 1, 'explicit integer version ≥ 1');
    t.ok(typeof d.title === 'string' && d.title.length > 0, 'title');
    t.ok(Array.isArray(d.tags) && d.tags.includes('edge-proxy'), 'tagged edge-proxy');
    t.ok(typeof d.schemaVersion === 'number' && d.schemaVersion >= 36, 'schemaVersion with datasource references by uid');
    const variables = ((d.templating as { list?: Record<string, unknown>[] } | undefined)?.list ?? []);
    const dsVar = variables.find((v) => v.name === 'datasource');
    t.match(dsVar, { type: 'datasource', query: 'prometheus' }, 'datasource variable');
    for (const v of variables.filter((v) => v.type === 'query')) {
      t.ok(usesDatasourceVariable(v.datasource), `variable ${String(v.name)} uses \${datasource}`);
      const query = typeof v.query === 'string' ? v.query : String((v.query as { query?: unknown }).query);
      const m = query.match(/^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$/);
      if (m === null) {
        t.fail(`variable ${String(v.name)}: expected label_values(selector, label), got ${query}`);
        continue;
      }
      const selector = m[1] ?? '';
      const label = m[2] ?? '';
      const r = checkExpr(`sum by (${label}) (${selector})`, known);
      t.same(r.problems, [], `variable ${String(v.name)}: ${query}`);
    }
    const panels = panelsOf((d.panels ?? []) as Panel[]);
    t.ok(panels.length >= 6, `${panels.length} panels`);
    const ids = [...panelsOf((d.panels ?? []) as Panel[]), ...((d.panels ?? []) as Panel[]).filter((p) => p.type === 'row')].map((p) => p.id);
    t.equal(new Set(ids).size, ids.length, 'panel ids unique');
    for (const p of panels) {
      const title = String(p.title);
      t.ok(usesDatasourceVariable(p.datasource), `${title}: datasource \${datasource}`);
      const targets = p.targets ?? [];
      t.ok(targets.length >= 1, `${title}: at least one target`);
      for (const target of targets) {
        if (target.datasource !== undefined) t.ok(usesDatasourceVariable(target.datasource), `${title} ${String(target.refId)}: datasource \${datasource}`);
        const expr = target.expr;
        if (typeof expr !== 'string' || expr.trim() === '') {
          t.fail(`${title} ${String(target.refId)}: no expression`);
          continue;
        }
        const r = checkExpr(expr, known);
        t.same(r.problems, [], `${title}: ${expr}`);
        t.ok(r.uses.length > 0, `${title}: selects a series`);
        // Catalogue series follow the dashboard's job/instance selection (recorded series carry
        // whatever labels their rule keeps, so they are not filtered).
        for (const u of r.uses.filter((u) => known.get(u.name) !== null)) t.ok(TARGET_LABELS.every((l) => u.matchers.includes(l)), `${title}: ${u.name} filtered by job and instance`);
      }
    }
  });
}
