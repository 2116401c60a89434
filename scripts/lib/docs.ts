// Renders the generated docs. Shared by scripts/gen-docs.ts and the test that keeps docs/ current.
import { CONFIG_ERROR_CODES, renderReference } from '@edge-proxy/config';
import { H3_ERROR_CODES } from '@edge-proxy/http3';
import { SERVICE_ERROR_CODES } from '@edge-proxy/controlplane';
import { requestErrorDocs } from '@edge-proxy/dataplane';
import { IPC_ERROR_CODES } from '@edge-proxy/ipc';

/** Error registries documented in docs/errors.md, one section per package. */
const REGISTRIES: readonly { pkg: string; intro: string; codes: Readonly<Record<string, string>> }[] = [
  {
    pkg: '@edge-proxy/config',
    intro: 'Configuration errors, reported at startup (`edge-proxy -c FILE`) and by validate, preview and activate. Each names the JSON path of the key at fault. `EmptySecret` and `MalformedPem*` keep the names the specification uses.',
    codes: CONFIG_ERROR_CODES,
  },
  {
    pkg: '@edge-proxy/controlplane',
    intro: 'Service errors: startup failures (printed as `edge-proxy serve: CODE: message`, exit status non-zero), state-directory problems and abandoned operations (log lines with a `code` field).',
    codes: SERVICE_ERROR_CODES,
  },
  {
    pkg: '@edge-proxy/dataplane',
    intro: 'Request-path errors: each answer the proxy writes itself names its code in the body (`503 Service Unavailable: route queue full (EDGE_SHED_QUEUE_FULL)`). Brackets: the status answered, the failure class metrics count it under, who caused it (downstream, upstream, internal) and whether another backend may be tried (`retryable`). Then the data plane\'s other codes (provisioning, worker protocol).',
    codes: requestErrorDocs(),
  },
  {
    pkg: '@edge-proxy/ipc',
    intro: 'Supervisor–worker channel errors (log lines and activation answers carry them in `code`).',
    codes: IPC_ERROR_CODES,
  },
  {
    pkg: '@edge-proxy/http3',
    intro: 'HTTP/3 (RFC 9114 §8.1) and QPACK (RFC 9204 §6) errors. The code string names the application error code sent on the wire (shown in brackets) as a stream reset or a connection close.',
    codes: Object.fromEntries(Object.entries(H3_ERROR_CODES).map(([code, info]) => [code, `[0x${info.wireCode.toString(16)}, ${info.scope}] ${info.description}`])),
  },
];

export function renderReferenceDoc(): string {
  return renderReference();
}

export function renderErrorsDoc(): string {
  const out = [
    '# Error codes',
    '',
    '<!-- Generated from each package\'s errors.ts by `npm run docs`; a test fails when this file is stale. -->',
    '',
    'Every error carries a stable code string. Scripts and code branch on the code, never on the message.',
    '',
  ];
  for (const r of REGISTRIES) {
    out.push(`## ${r.pkg}`, '', r.intro, '', '| code | meaning |', '|---|---|');
    for (const [code, meaning] of Object.entries(r.codes)) out.push(`| \`${code}\` | ${meaning.replace(/\|/g, '\\|')} |`);
    out.push('');
  }
  return out.join('\n');
}
