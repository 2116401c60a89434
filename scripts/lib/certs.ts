// Test and development certificates, made with the system `openssl` into a directory the caller
// owns (a temp dir for tests, a state dir for `npm start`). Nothing generated here is committed.
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** Paths of a generated certificate and key. */
export interface CertFiles {
  readonly cert: string;
  readonly key: string;
}

function openssl(args: string[], cwd: string): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
}

/** Creates a CA (`<name>.crt`, `<name>.key`) in `dir`. */
export function makeCa(dir: string, name = 'ca', subject = '/CN=edge-proxy test CA'): CertFiles {
  mkdirSync(dir, { recursive: true });
  const files = { cert: path.join(dir, `${name}.crt`), key: path.join(dir, `${name}.key`) };
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '30', '-subj', subject, '-keyout', files.key, '-out', files.cert,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], dir);
  return files;
}

/** Options of a leaf certificate. */
export interface LeafOptions {
  /** DNS names and IP addresses for the SAN extension (IPs detected by form). */
  readonly sans?: readonly string[];
  /** Subject, e.g. `/CN=alice/OU=operator`. */
  readonly subject?: string;
  readonly days?: number;
  /** `server` (default) or `client` extended key usage. */
  readonly usage?: 'server' | 'client';
}

/** Creates a leaf certificate signed by `ca` (or self-signed when `ca` is undefined). */
export function makeLeaf(dir: string, name: string, ca: CertFiles | undefined, options: LeafOptions = {}): CertFiles {
  mkdirSync(dir, { recursive: true });
  const files = { cert: path.join(dir, `${name}.crt`), key: path.join(dir, `${name}.key`) };
  const sans = (options.sans ?? ['localhost', '127.0.0.1', '::1']).map((s) => (/^[\d.]+$|:/.test(s) ? `IP:${s}` : `DNS:${s}`)).join(',');
  const ext = path.join(dir, `${name}.ext`);
  const eku = options.usage === 'client' ? 'clientAuth' : 'serverAuth';
  writeFileSync(ext, `basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=${eku}\n${sans.length > 0 ? `subjectAltName=${sans}\n` : ''}`);
  const subject = options.subject ?? `/CN=${options.sans?.[0] ?? name}`;
  const days = String(options.days ?? 30);
  openssl(['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-subj', subject, '-keyout', files.key, '-out', `${files.cert}.csr`], dir);
  if (ca === undefined) {
    openssl(['x509', '-req', '-in', `${files.cert}.csr`, '-signkey', files.key, '-days', days, '-extfile', ext, '-out', files.cert], dir);
  } else {
    openssl(['x509', '-req', '-in', `${files.cert}.csr`, '-CA', ca.cert, '-CAkey', ca.key, '-CAcreateserial', '-days', days, '-extfile', ext, '-out', files.cert], dir);
  }
  return files;
}
