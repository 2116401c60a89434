// What every cross-field rule receives, and the helpers several rules share.
import net from 'node:net';
import type { RawConfig } from '../schema/root.ts';
import type { ConfigIssue } from '../errors.ts';
import type { SecretSource } from '../secrets/refs.ts';

/** Input of a rule: the schema-defaulted document (possibly schema-invalid) and the extracted secrets. */
export interface RuleContext {
  readonly doc: RawConfig;
  readonly secrets: ReadonlyMap<string, SecretSource>;
  /** Paths of every secret field that was set (valid or not), since extraction removes them from `doc`. */
  readonly secretFieldsPresent: ReadonlySet<string>;
}

/** A named cross-field rule. Rules read defensively: on a schema-invalid document they may see any shape. */
export interface Rule {
  readonly name: string;
  check(ctx: RuleContext): ConfigIssue[];
}

/** `Object.entries` of a record that may be missing or malformed. */
export function entriesOf<V>(record: Readonly<Record<string, V>> | undefined | null): [string, V][] {
  return record !== null && typeof record === 'object' && !Array.isArray(record) ? Object.entries(record) : [];
}

/** Items of an array that may be missing or malformed. */
export function itemsOf<V>(list: readonly V[] | undefined | null): V[] {
  return Array.isArray(list) ? [...list] : [];
}

/** True for 127.0.0.0/8, ::1 and IPv4-mapped loopback. */
export function isLoopback(address: string): boolean {
  if (net.isIPv4(address)) return address.startsWith('127.');
  const lower = address.toLowerCase();
  return lower === '::1' || lower.startsWith('::ffff:127.');
}

const WILDCARD_V4 = '0.0.0.0';
const WILDCARD_V6 = '::';

/** Whether two binds on the same port overlap: same address, or a wildcard covering the other's family. */
export function bindsOverlap(a: string, b: string): boolean {
  const norm = (x: string): string => (net.isIPv6(x) ? x.toLowerCase() : x);
  const [x, y] = [norm(a), norm(b)];
  if (x === y) return true;
  if (x === WILDCARD_V6 || y === WILDCARD_V6) return true; // `::` is dual-stack on Linux by default
  if (x === WILDCARD_V4) return net.isIPv4(y);
  if (y === WILDCARD_V4) return net.isIPv4(x);
  return false;
}

/** Request key specs shared by consistent hashing, rate limits and quota selectors. */
export const KEY_SPEC = /^(client_ip|host|path|route|(header|cookie|query):[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128})$/;

/** A DNS host name (RFC 1123 labels), optionally with a leading `*.` when `wildcard` is allowed. */
export function isDnsName(name: string, wildcard: boolean): boolean {
  const body = wildcard && name.startsWith('*.') ? name.slice(2) : name;
  if (body.length === 0 || body.length > 253) return false;
  return body.split('.').every((label) => /^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/.test(label));
}

/**
 * The repeats in a list: every item whose key (when defined) was already seen, with the index
 * of its first occurrence. Shared by the uniqueness rules (names, ids, server names, tokens).
 */
export function repeats<T>(items: readonly T[], keyOf: (item: T) => string | undefined): { item: T; index: number; firstIndex: number }[] {
  const first = new Map<string, number>();
  const out: { item: T; index: number; firstIndex: number }[] = [];
  items.forEach((item, index) => {
    const key = keyOf(item);
    if (key === undefined) return;
    const seen = first.get(key);
    if (seen === undefined) first.set(key, index);
    else out.push({ item, index, firstIndex: seen });
  });
  return out;
}
