// PEM checks and fingerprints. Messages name what is wrong, never the bytes.
import { createHash, createHmac, createPrivateKey, randomBytes, X509Certificate } from 'node:crypto';
import type { KeyObject } from 'node:crypto';

/** `sha256:<hex>` of the exact bytes of public material (certificates, CA bundles). */
export function fingerprint(content: string | Uint8Array): string {
  return `sha256:${createHash('sha256').update(content).digest('hex')}`;
}

let processKey: Buffer | undefined;

/**
 * `hmac-sha256:<hex>` of secret bytes (tokens, keys, a file that may hold them) under a node-local
 * key. A plain hash of a low-entropy secret can be reversed offline with a word list; a keyed one
 * still shows a rotation (the value changes) but cannot be guessed without the key. The service
 * keeps its key in its state directory, so fingerprints stay comparable across restarts; without
 * one, a random key is made once per process.
 */
export function keyedFingerprint(content: string | Uint8Array, key?: Uint8Array): string {
  return `hmac-sha256:${createHmac('sha256', key ?? (processKey ??= randomBytes(32))).update(content).digest('hex')}`;
}

const CERT_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** Splits a PEM bundle into its certificate blocks and parses each; `undefined` when none parses or any fails. */
export function parseCertificates(pem: string): X509Certificate[] | undefined {
  const blocks = pem.match(CERT_BLOCK);
  if (blocks === null) return undefined;
  try {
    return blocks.map((b) => new X509Certificate(b));
  } catch {
    return undefined;
  }
}

/** Parses a PEM private key; `undefined` when it is not one. */
export function parsePrivateKey(pem: string): KeyObject | undefined {
  if (!/-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(pem)) return undefined;
  try {
    return createPrivateKey({ key: pem, format: 'pem' });
  } catch {
    return undefined;
  }
}

/** `notAfter` of a certificate in unix seconds. */
export function notAfterUnixSeconds(cert: X509Certificate): number {
  return Math.floor(new Date(cert.validTo).getTime() / 1000);
}

/** DNS names and IP addresses of the subject alternative name extension. */
export function subjectAltNames(cert: X509Certificate): string[] {
  const san = cert.subjectAltName;
  if (san === undefined) return [];
  return san
    .split(/,\s*/)
    .map((entry) => /^(?:DNS|IP Address):(.+)$/.exec(entry)?.[1])
    .filter((v): v is string => v !== undefined);
}
