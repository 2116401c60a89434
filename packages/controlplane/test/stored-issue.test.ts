// Stored forms of configuration issues (issue 38 finding 6): the names of keys the schema does not
// define, which a YAML-shaped file such as a copy of /etc/shadow turns into its own lines, leave the
// immediate answer only; history, logs and audit keep the path of the known keys and a mark.
import t from 'tap';
import { parseConfigText, validateConfig } from '@edge-proxy/config';
import type { ConfigIssue } from '@edge-proxy/config';
import { INVALID_NAME, UNKNOWN_KEY, publicAndStored, storedIssue } from '../src/generations/stored-issue.ts';

const SHADOW = 'root:$6$salt$hash:19000:0:99999:7:::';
/** The validator's issues of a YAML text, as the control plane makes them public. */
function issues(yaml: string): ConfigIssue[] {
  const parsed = parseConfigText(yaml);
  if (!parsed.ok) return parsed.issues.map(publicAndStored);
  const v = validateConfig(parsed.value, '/etc/edge-proxy');
  return v.ok ? [] : v.issues.map(publicAndStored);
}

const base = 'listen: { address: 127.0.0.1, port: 8443, tls: { cert: /c.pem, key: /k.pem } }\nupstream: { app: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:1" }] } }\n';
const cases: { name: string; yaml: string; code: string; public: string | RegExp; stored: string }[] = [
  { name: 'a shadow line at the top level', yaml: `${SHADOW}\n`, code: 'EDGE_CONFIG_UNKNOWN_KEY', public: /^root:\$6\$salt\$hash/, stored: UNKNOWN_KEY },
  { name: 'a shadow line with dots in it', yaml: `${base}"root.x:$6$a.b$c.d": 1\n`, code: 'EDGE_CONFIG_UNKNOWN_KEY', public: /^root\.x/, stored: UNKNOWN_KEY },
  { name: 'an unknown key under a known one', yaml: `${base.replace('port: 8443,', `port: 8443, "${SHADOW}": 1,`)}`, code: 'EDGE_CONFIG_UNKNOWN_KEY', public: /^listen\.root:/, stored: `listen.${UNKNOWN_KEY}` },
  { name: 'an unknown key in a named pool', yaml: base.replace('route: { path_prefix: / },', `route: { path_prefix: / }, "${SHADOW}": 1,`), code: 'EDGE_CONFIG_UNKNOWN_KEY', public: /^upstream\.app\.root:/, stored: `upstream.app.${UNKNOWN_KEY}` },
  { name: 'an unknown key in a list item', yaml: base.replace('id: a,', `id: a, "${SHADOW}": 1,`), code: 'EDGE_CONFIG_UNKNOWN_KEY', public: /^upstream\.app\.backends\[0\]\.root:/, stored: `upstream.app.backends[0].${UNKNOWN_KEY}` },
  { name: 'a pool name the pattern refuses', yaml: base.replace('upstream: { app:', `upstream: { "${SHADOW}":`), code: 'EDGE_CONFIG_FORMAT', public: /^upstream\.root:/, stored: `upstream.${INVALID_NAME}` },
];
for (const c of cases) {
  const all = issues(c.yaml);
  const i = all.find((x) => x.code === c.code && (typeof c.public === 'string' ? x.path === c.public : c.public.test(x.path)));
  t.ok(i, `${c.name}: the public issue names the key (the operator's answer)`);
  if (i === undefined) continue;
  t.same(storedIssue(i), { path: c.stored, code: c.code, message: i.message }, `${c.name}: stored as ${c.stored}`);
  t.notOk(JSON.stringify(all.map(storedIssue)).includes('$6$'), `${c.name}: no stored form holds the line`);
}

// Issues of known keys keep their path; a value of the wrong form (EDGE_CONFIG_FORMAT too) as well.
const known = issues(base.replace('port: 8443', 'port: 70000').replace('path_prefix: /', 'path_prefix: "no-slash"'));
t.ok(known.length >= 2);
for (const i of known) t.same(storedIssue(i), { path: i.path, code: i.code, message: i.message }, `${i.code} at ${i.path}: kept as is`);
// An unknown-key issue that did not come through publicAndStored: hidden whole (fail closed).
t.same(storedIssue({ path: `a.${SHADOW}`, code: 'EDGE_CONFIG_UNKNOWN_KEY', message: 'x' }), { path: UNKNOWN_KEY, code: 'EDGE_CONFIG_UNKNOWN_KEY', message: 'x' });
t.same(storedIssue({ path: 'listen.port', code: 'EDGE_CONFIG_RANGE', message: 'x' }), { path: 'listen.port', code: 'EDGE_CONFIG_RANGE', message: 'x' });
