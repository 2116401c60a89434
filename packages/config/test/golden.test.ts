// Golden files: realistic configurations and their normalized output (`fixtures/*.yaml` →
// `*.expected.json`). Regenerate after an intended change with UPDATE_GOLDEN=1 and review the diff.
import t from 'tap';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseConfigText, validateConfig } from '../src/index.ts';

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtures = path.join(here, 'fixtures');
const inputs = [
  ...readdirSync(fixtures).filter((f) => f.endsWith('.yaml')).map((f) => path.join(fixtures, f)),
  path.resolve(here, '../../../deploy/config.example.yaml'),
];

for (const input of inputs) {
  t.test(path.basename(input), async (t) => {
    const parsed = parseConfigText(readFileSync(input, 'utf8'));
    t.ok(parsed.ok, 'parses');
    if (!parsed.ok) return;
    const r = validateConfig(parsed.value, '/etc/edge-proxy');
    t.ok(r.ok, r.ok ? 'validates' : JSON.stringify(r.issues));
    if (!r.ok) return;
    const actual = `${JSON.stringify(r.value.config, null, 2)}\n`;
    const expectedFile = path.join(fixtures, `${path.basename(input, '.yaml')}.expected.json`);
    if (process.env['UPDATE_GOLDEN'] === '1') writeFileSync(expectedFile, actual);
    t.equal(actual, readFileSync(expectedFile, 'utf8'), `normalized output matches ${path.basename(expectedFile)}`);
  });
}
