// Request validation (phase 2a of docs/request-path.md): whether a request is well-formed enough
// to be judged by policy and routing at all, and the one normalized target that policy, routing
// and the backend then share. Runs before the protocol policy on every ingress, including the
// HTTP/1.1 upgrade path. Pure; table-tested in test/request-validation.test.ts.
//
// Rules (docs/decisions.md, "Request validation"):
// - `OPTIONS *` (RFC 9110 §9.3.7) is answered here with the methods the proxy accepts; `*` with
//   any other method is malformed;
// - HTTP/1.1 absolute-form (RFC 9112 §3.2.2): the target's authority replaces Host for routing
//   and forwarding, the target becomes origin-form; HTTP/2 and HTTP/3 `:path` must be
//   origin-form (RFC 9113 §8.3.1, RFC 9114 §4.3.1), and `:scheme` `https` or `http`;
// - Host and `:authority`: one Host field, `host[:port]` without userinfo;
// - HTTP/3 field values: the characters node's HTTP/1.1 and HTTP/2 parsers refuse (controls
//   other than HTAB, DEL, code points above 0xFF) are refused too, so such a request is the
//   client's 400, not a failure inside the upstream client charged to a backend;
// - HTTP/1.1 `Transfer-Encoding` other than `chunked`: 501 (RFC 9112 §6.1), since the body is
//   re-framed upstream and another coding would be lost;
// - `Content-Length` that is not 1*DIGIT, or a list or repeated field whose members differ
//   (RFC 9110 §8.6, RFC 9112 §6.3): 400; a valid one is forwarded in canonical form
//   (policy/content-length.ts);
// - the target is normalized (routing/normalize-target.ts).
import type { HeaderMap } from '../upstream/headers.ts';
import { canonicalContentLength } from './content-length.ts';
import { isTargetRejection, isValidAuthority, normalizeOriginForm, splitAbsoluteForm } from '../routing/normalize-target.ts';
import type { TargetRejectReason } from '../routing/normalize-target.ts';

/** The parts of a request validation reads (the handler's downstream request has this shape). */
export interface ValidationRequest {
  readonly method: string;
  readonly path: string;
  readonly authority: string | undefined;
  readonly host: string | undefined;
  readonly headers: HeaderMap;
  readonly protocol: '1.1' | '2' | '3';
  /** `:scheme` (HTTP/2, HTTP/3); undefined on HTTP/1.1. */
  readonly scheme?: string | undefined;
  /** More than one Host field line arrived (the header object keeps only one). */
  readonly duplicateHost?: boolean;
}

export type ValidationReason = TargetRejectReason | 'asterisk_target' | 'invalid_scheme' | 'invalid_authority' | 'duplicate_host' | 'invalid_header_value' | 'invalid_content_length' | 'unsupported_transfer_coding';

export type ValidationVerdict =
  /** Valid, and the request is used as it is. */
  | { readonly kind: 'valid' }
  /** Valid once normalized: policy, routing and the backend use these. */
  | { readonly kind: 'rewrite'; readonly path: string; readonly authority: string | undefined; readonly host: string | undefined }
  /** `OPTIONS *`: answered by the proxy with `Allow`. */
  | { readonly kind: 'options'; readonly allow: string }
  | { readonly kind: 'reject'; readonly status: 400 | 501; readonly reason: ValidationReason };

const VALID: ValidationVerdict = Object.freeze({ kind: 'valid' });
const REJECTS = new Map<ValidationReason, ValidationVerdict>();
function reject(reason: ValidationReason): ValidationVerdict {
  let v = REJECTS.get(reason);
  if (v === undefined) {
    v = Object.freeze({ kind: 'reject', status: reason === 'unsupported_transfer_coding' ? 501 : 400, reason });
    REJECTS.set(reason, v);
  }
  return v;
}

/** The methods a proxy with no `allowed_methods` accepts, for `OPTIONS *` (RFC 9110 §9.3). */
export const DEFAULT_ALLOW = 'GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS';

/**
 * Validates `r` and works out its normalized target. `allowedMethods` is the protocol policy's
 * list (empty: every method), for the `Allow` of `OPTIONS *`.
 */
export function validateRequest(r: ValidationRequest, allowedMethods: readonly string[]): ValidationVerdict {
  if (r.duplicateHost === true) return reject('duplicate_host');
  const length = r.headers['content-length'];
  if (length !== undefined && canonicalContentLength(length) === null) return reject('invalid_content_length');
  if (r.protocol === '3' && !validFieldValues(r.headers)) return reject('invalid_header_value');
  if (r.protocol !== '1.1' && r.method !== 'CONNECT' && r.scheme !== 'https' && r.scheme !== 'http') return reject('invalid_scheme');
  if (r.protocol === '1.1') {
    const te = r.headers['transfer-encoding'];
    if (te !== undefined && !onlyChunked(te)) return reject('unsupported_transfer_coding');
  }
  let authority = r.authority;
  let host = r.host;
  if ((authority !== undefined && !isValidAuthority(authority)) || (host !== undefined && host !== authority && !isValidAuthority(host))) return reject('invalid_authority');
  // CONNECT's target is an authority (RFC 9110 §9.3.6), judged by the protocol policy.
  if (r.method === 'CONNECT') return VALID;
  let target = r.path;
  if (target === '*') {
    if (r.method !== 'OPTIONS') return reject('asterisk_target');
    // With OPTIONS outside `allowed_methods`, the protocol policy answers 405 as for any OPTIONS.
    if (allowedMethods.length > 0 && !allowedMethods.includes('OPTIONS')) return VALID;
    return { kind: 'options', allow: allowedMethods.length > 0 ? allowedMethods.join(', ') : DEFAULT_ALLOW };
  }
  let rewritten = false;
  if (target.charCodeAt(0) !== 0x2f /* / */) {
    // Absolute-form is HTTP/1.1's alone; HTTP/2 and HTTP/3 carry the authority in :authority.
    if (r.protocol !== '1.1') return reject('invalid_target_form');
    const abs = splitAbsoluteForm(target);
    if (isTargetRejection(abs)) return reject(abs.reason);
    // RFC 9112 §3.2.2: the target's authority wins; the Host field is ignored.
    authority = abs.authority;
    host = abs.authority;
    target = abs.originForm;
    rewritten = true;
  }
  const normalized = normalizeOriginForm(target);
  if (isTargetRejection(normalized)) return reject(normalized.reason);
  if (!rewritten && normalized === r.path) return VALID;
  return { kind: 'rewrite', path: normalized, authority, host };
}

/** `Transfer-Encoding` naming `chunked` alone (any case, any surrounding space). */
function onlyChunked(te: string | string[]): boolean {
  const v = Array.isArray(te) ? te.join(',') : te;
  return v === 'chunked' || v.trim().toLowerCase() === 'chunked';
}

/**
 * Field values hold HTAB, visible ASCII and obs-text only (RFC 9110 §5.5; the set node's parsers
 * and undici accept).
 */
function validFieldValues(headers: HeaderMap): boolean {
  for (const name in headers) {
    const v = headers[name];
    if (v === undefined) continue;
    if (typeof v === 'string') {
      if (!validFieldValue(v)) return false;
    } else {
      for (const x of v) if (!validFieldValue(x)) return false;
    }
  }
  return true;
}

/** A field value of HTAB, visible ASCII and obs-text only (the rule of node's parsers and undici). */
export function validFieldValue(v: string): boolean {
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if ((c < 0x20 && c !== 0x09) || c === 0x7f || c > 0xff) return false;
  }
  return true;
}
