// Property tests: arbitrary input never makes parsing or validation throw; it yields a result or coded issues.
import t from 'tap';
import fc from 'fast-check';
import { dump } from 'js-yaml';
import { CONFIG_ERROR_CODES, parseConfigText, validateConfig } from '../src/index.ts';
import { base } from './fixtures/base.ts';

const codes = new Set(Object.keys(CONFIG_ERROR_CODES));
const KEYS = ['listen', 'listeners', 'upstream', 'tls', 'cert', 'key', 'port', 'address', 'route', 'path_prefix', 'backends', 'id', 'resilience', 'brownout', 'token', 'token_ref', 'ref', 'version', '__proto__', 'constructor'];

function assertCoded(t: { fail(message: string): unknown }, result: { ok: boolean; issues?: { code: string; path: string; message: string }[] }): void {
  if (result.ok) return;
  for (const i of result.issues ?? []) {
    if (!codes.has(i.code) || typeof i.path !== 'string' || typeof i.message !== 'string') t.fail(`uncoded issue ${JSON.stringify(i)}`);
  }
}

t.test('arbitrary JSON values', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6 }), (v) => {
        assertCoded(t, validateConfig(v, '/tmp'));
      }),
      { numRuns: 1500 },
    );
  }, 'no throw');
});

t.test('arbitrary objects built from real config keys', async (t) => {
  const leaf = fc.oneof(fc.integer(), fc.string(), fc.boolean(), fc.constant(null), fc.double());
  const tree = fc.letrec((tie) => ({
    node: fc.oneof({ depthSize: 'small' }, leaf, fc.array(tie('node'), { maxLength: 3 }), fc.dictionary(fc.constantFrom(...KEYS), tie('node'), { maxKeys: 4 })),
  })).node;
  t.doesNotThrow(() => {
    fc.assert(fc.property(fc.dictionary(fc.constantFrom(...KEYS), tree, { maxKeys: 6 }), (v) => assertCoded(t, validateConfig(v, '/tmp'))), { numRuns: 1500 });
  }, 'no throw');
});

t.test('mutations of a valid document', async (t) => {
  const paths = ['listen', 'listen.port', 'listen.tls', 'upstream', 'upstream.api', 'upstream.api.backends', 'upstream.api.route'];
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.constantFrom(...paths), fc.jsonValue({ maxDepth: 3 }), (p, value) => {
        const d = base();
        const parts = p.split('.');
        let node: Record<string, unknown> = d;
        for (const k of parts.slice(0, -1)) node = node[k] as Record<string, unknown>;
        node[parts.at(-1) as string] = value;
        assertCoded(t, validateConfig(d, '/tmp'));
      }),
      { numRuns: 1500 },
    );
  }, 'no throw');
});

t.test('arbitrary text and YAML renderings through the parser', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.oneof(fc.string({ maxLength: 400 }), fc.jsonValue({ maxDepth: 4 }).map((v) => dump(v))), (text) => {
        const parsed = parseConfigText(text);
        if (parsed.ok) assertCoded(t, validateConfig(parsed.value, '/tmp'));
        else assertCoded(t, parsed);
      }),
      { numRuns: 1500 },
    );
  }, 'no throw');
});
