// Where `edge-proxy ctl` connects and with what credentials: command-line options first, then
// environment variables, then the service's own configuration file (`-c`, default
// /etc/edge-proxy/config.yaml). Failures are one-line messages (exit 1); no token is ever in one.
import { X509Certificate } from 'node:crypto';
import { stat } from 'node:fs/promises';
import path from 'node:path';
import { describeReadFailure, formatIssue, parseConfigText, readBoundedFile, validateConfig } from '@edge-proxy/config';
import type { NormalizedConfig } from '@edge-proxy/config';
import { DEFAULT_TIMEOUT_MS } from './ctl-client.ts';
import type { Target } from './ctl-client.ts';
import { DEFAULT_API_PATHS } from './ctl-request.ts';
import type { ApiPaths } from './ctl-request.ts';

/** Environment variables read when the matching option is absent (docs/operations.md). */
export const CTL_ENV = Object.freeze({
  url: 'EDGE_PROXY_URL',
  tokenFile: 'EDGE_PROXY_TOKEN_FILE',
  ca: 'EDGE_PROXY_CA',
  cert: 'EDGE_PROXY_CERT',
  key: 'EDGE_PROXY_KEY',
});

/** Connection options as given on the command line. */
export interface TargetOptions {
  readonly url?: string;
  /** `-c FILE` as given; undefined when absent (then EDGE_PROXY_URL, else the default file). */
  readonly config?: string;
  readonly defaultConfig: string;
  readonly tokenFile?: string;
  readonly ca?: string;
  readonly cert?: string;
  readonly key?: string;
  readonly insecure?: boolean;
  readonly servername?: string;
  readonly timeoutMs?: number;
}

export type Resolved = { readonly ok: true; readonly target: Target; readonly paths: ApiPaths } | { readonly ok: false; readonly message: string };

/** The control API settings `-c` takes from a configuration. */
export interface FromConfig {
  readonly url: URL;
  /** The configured certificate chain of the control API (its own, else the first listener's). */
  readonly certFile: string | undefined;
  readonly paths: ApiPaths;
}

/** A bind address as a host to connect to: the wildcard addresses mean this host's loopback. */
export function connectHost(address: string): string {
  if (address === '0.0.0.0' || address === '') return '127.0.0.1';
  if (address === '::' || address === '::0' || address === '[::]') return '::1';
  return address;
}

/** The control API address, port, certificate and paths of a validated configuration. */
export function fromConfig(config: NormalizedConfig, baseDir: string): FromConfig | string {
  const api = config.observability.control_api;
  if (!api.enabled) return 'observability.control_api.enabled is false: the service serves no control API';
  const host = connectHost(api.address);
  const url = new URL(`https://${host.includes(':') ? `[${host}]` : host}:${api.port}`);
  const first = config.listeners[0]?.tls;
  const cert = api.tls.cert ?? first?.cert ?? first?.certificates[0]?.cert;
  return { url, certFile: cert === undefined ? undefined : path.resolve(baseDir, cert), paths: { reload: api.reload_path, reloadCerts: api.reload_certs_path } };
}

/**
 * Reads `-c FILE` the way the service does (bounded read, YAML, schema and rules) but resolves no
 * secret: ctl needs the address, not the keys, and may run as a user who cannot read them.
 */
async function loadServiceConfig(file: string): Promise<FromConfig | string> {
  const abs = path.resolve(file);
  const read = await readBoundedFile(abs);
  if (!read.ok) return `cannot use -c ${abs}: ${describeReadFailure(read.failure)}`;
  const parsed = parseConfigText(read.bytes.toString('utf8'));
  const validated = parsed.ok ? validateConfig(parsed.value, path.dirname(abs)) : parsed;
  if (!validated.ok) return `cannot use -c ${abs}: invalid configuration; ${validated.issues.map(formatIssue).join('; ')}`;
  return fromConfig(validated.value.config, validated.value.baseDir);
}

/** Largest token file read (bytes): one token of at most 4096 characters, and a line end. */
export const MAX_TOKEN_FILE_BYTES = 8192;

/**
 * A file ctl is told to read (token, CA bundle, client certificate and key): only a regular file,
 * bounded, never blocking on a FIFO (readBoundedFile); the message names the file, never its bytes.
 */
async function readText(what: string, file: string, maxBytes?: number): Promise<string | { error: string }> {
  const read = await readBoundedFile(file, maxBytes === undefined ? {} : { maxBytes });
  if (!read.ok) return { error: `cannot read the ${what} ${file}: ${describeReadFailure(read.failure, maxBytes)}` };
  return read.bytes.toString('utf8');
}

/**
 * Why a token file may not be used: one that every user of the host may read or write holds a
 * credential that is no longer one (as ssh refuses such a private key). Group access is the
 * operator's choice (a deploy group).
 */
export async function tokenFileProblem(file: string): Promise<string | undefined> {
  const st = await stat(file).catch(() => undefined);
  if (st === undefined) return undefined;
  if ((st.mode & 0o006) !== 0) return `the token file ${file} is ${(st.mode & 0o002) !== 0 ? 'writable' : 'readable'} by every user (mode ${(st.mode & 0o777).toString(8).padStart(4, '0')}): chmod o-rw it`;
  return undefined;
}

/**
 * The token of a token file: its content without the trailing newline. A file that holds anything
 * but one token on one line is refused (the message never quotes it).
 */
export function tokenOf(text: string): string | undefined {
  const token = text.replace(/\r?\n$/, '');
  return /^[\x21-\x7e]{1,4096}$/.test(token) ? token : undefined;
}

/** Parses `--url`: an https origin (the control API is HTTPS only; a token never goes in clear). */
export function parseUrl(text: string): URL | string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return `--url ${text}: not a URL`;
  }
  if (url.protocol !== 'https:') return `--url ${url.origin}: the control API is HTTPS only`;
  if (url.username !== '' || url.password !== '') return '--url: credentials in the URL are refused; use --token-file';
  if ((url.pathname !== '/' && url.pathname !== '') || url.search !== '' || url.hash !== '') return `--url ${url.origin}${url.pathname}: give the origin only (https://HOST:PORT)`;
  return url;
}

/** Resolves the target of a call from options, `env` and the service's configuration. */
export async function resolveTarget(o: TargetOptions, env: NodeJS.ProcessEnv): Promise<Resolved> {
  const fail = (message: string): Resolved => ({ ok: false, message });
  const envUrl = env[CTL_ENV.url] === '' ? undefined : env[CTL_ENV.url];
  // An explicit -c is read; the default file only when no URL is given at all.
  const configFile = o.config ?? (o.url === undefined && envUrl === undefined ? o.defaultConfig : undefined);
  let cfg: FromConfig | undefined;
  if (configFile !== undefined) {
    const c = await loadServiceConfig(configFile);
    if (typeof c === 'string') return fail(o.config === undefined ? `${c} (give --url, ${CTL_ENV.url} or -c FILE)` : c);
    cfg = c;
  }
  const urlText = o.url ?? (o.config === undefined ? envUrl : undefined);
  const url = urlText === undefined ? cfg?.url : parseUrl(urlText);
  if (typeof url === 'string') return fail(url);
  if (url === undefined) return fail(`no control API address: give --url, ${CTL_ENV.url} or -c FILE`);

  const pick = (opt: string | undefined, name: keyof typeof CTL_ENV): string | undefined => opt ?? (env[CTL_ENV[name]] === '' ? undefined : env[CTL_ENV[name]]);
  let ca: string[] | undefined;
  let pin: string | undefined;
  const caFile = pick(o.ca, 'ca');
  if (caFile !== undefined) {
    const text = await readText('CA file', caFile);
    if (typeof text !== 'string') return fail(text.error);
    ca = [text];
  } else if (cfg?.certFile !== undefined) {
    // No CA given: trust the certificate chain the service is configured to present.
    const text = await readText("control API certificate named by the service's configuration", cfg.certFile);
    if (typeof text !== 'string') return fail(`${text.error} (give --ca FILE)`);
    try {
      pin = new X509Certificate(text).fingerprint256;
    } catch {
      return fail(`${cfg.certFile}: not a PEM certificate (give --ca FILE)`);
    }
    ca = [text];
  }

  let token: string | undefined;
  const tokenFile = pick(o.tokenFile, 'tokenFile');
  if (tokenFile !== undefined) {
    const text = await readText('token file', tokenFile, MAX_TOKEN_FILE_BYTES);
    if (typeof text !== 'string') return fail(text.error);
    const loose = await tokenFileProblem(tokenFile);
    if (loose !== undefined) return fail(loose);
    token = tokenOf(text);
    if (token === undefined) return fail(`the token file ${tokenFile} must hold one token (printable, no spaces, at most 4096 characters) on one line`);
  }

  const certFile = pick(o.cert, 'cert');
  const keyFile = pick(o.key, 'key');
  if ((certFile === undefined) !== (keyFile === undefined)) return fail('--cert and --key go together (client certificate and its key)');
  let cert: string | undefined;
  let key: string | undefined;
  if (certFile !== undefined && keyFile !== undefined) {
    const c = await readText('client certificate', certFile);
    if (typeof c !== 'string') return fail(c.error);
    const k = await readText('client key', keyFile);
    if (typeof k !== 'string') return fail(k.error);
    [cert, key] = [c, k];
  }

  const target: Target = {
    url,
    insecure: o.insecure === true,
    timeoutMs: o.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    ...(ca === undefined ? {} : { ca }),
    ...(pin === undefined ? {} : { pin }),
    ...(o.servername === undefined ? {} : { servername: o.servername }),
    ...(cert === undefined ? {} : { cert, key }),
    ...(token === undefined ? {} : { token }),
  };
  return { ok: true, target, paths: cfg?.paths ?? DEFAULT_API_PATHS };
}
