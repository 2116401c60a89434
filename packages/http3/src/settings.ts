// HTTP/3 SETTINGS (RFC 9114 §7.2.4): a sequence of (identifier, value) varint pairs.

import { H3Error } from './errors.ts';
import { isReservedCodepoint, reservedCodepoint } from './reserved.ts';
import { decodeVarint, varintLength, writeVarint } from './varint.ts';

/** Setting identifiers we understand (RFC 9114 §7.2.4.1, RFC 9204 §5, RFC 9220 §3, RFC 9297 §2.1.1). */
export const SETTING_ID = {
  QPACK_MAX_TABLE_CAPACITY: 0x01,
  MAX_FIELD_SECTION_SIZE: 0x06,
  QPACK_BLOCKED_STREAMS: 0x07,
  ENABLE_CONNECT_PROTOCOL: 0x08,
  H3_DATAGRAM: 0x33,
} as const;

/** RFC 9114 §7.2.4.1, §11.2.2: HTTP/2 setting identifiers that have no HTTP/3 equivalent and MUST be rejected. */
const HTTP2_ONLY_SETTING_IDS: ReadonlySet<number> = new Set([0x02, 0x03, 0x04, 0x05]);

/** The HTTP/3 settings of one endpoint, with RFC defaults applied to absent identifiers. */
export interface Http3Settings {
  /** Bytes of QPACK dynamic table the sender's decoder accepts. Default 0 (RFC 9204 §5). */
  qpackMaxTableCapacity: number;
  /** Largest field section the sender accepts, in bytes as counted by RFC 9114 §4.2.2. Default: unlimited (Infinity). */
  maxFieldSectionSize: number;
  /** Streams the sender's QPACK decoder lets block. Default 0 (RFC 9204 §5). */
  qpackBlockedStreams: number;
  /** Extended CONNECT (RFC 9220) is supported. Default false. */
  enableConnectProtocol: boolean;
  /** HTTP Datagrams (RFC 9297) are supported. Default false. */
  h3Datagram: boolean;
}

/** The settings in force before a peer's SETTINGS frame arrives (RFC 9114 §7.2.4.2). */
export const DEFAULT_SETTINGS: Readonly<Http3Settings> = Object.freeze({
  qpackMaxTableCapacity: 0,
  maxFieldSectionSize: Infinity,
  qpackBlockedStreams: 0,
  enableConnectProtocol: false,
  h3Datagram: false,
});

/**
 * Decodes a SETTINGS frame payload. Unknown and reserved identifiers are ignored (§7.2.4).
 * Throws H3_SETTINGS_ERROR for a duplicate identifier, an HTTP/2-only identifier, or a boolean
 * setting other than 0 or 1; H3_FRAME_ERROR when the payload ends inside a pair.
 * Numeric values above 2^53-1 are clamped to Number.MAX_SAFE_INTEGER ("as much as you like").
 */
export function decodeSettings(payload: Uint8Array): Http3Settings {
  const settings: Http3Settings = { ...DEFAULT_SETTINGS };
  const seen = new Set<number>();
  let at = 0;
  while (at < payload.length) {
    const id = decodeVarint(payload, at);
    if (id === null) throw new H3Error('H3_FRAME_ERROR', 'SETTINGS: truncated identifier');
    at += id.length;
    const value = decodeVarint(payload, at);
    if (value === null) throw new H3Error('H3_FRAME_ERROR', 'SETTINGS: truncated value');
    at += value.length;
    // Identifiers above 2^53 are inexact and unknown to us; they cannot be compared for duplicates.
    if (Number.isSafeInteger(id.value)) {
      if (seen.has(id.value)) throw new H3Error('H3_SETTINGS_ERROR', `SETTINGS: duplicate identifier 0x${id.value.toString(16)}`);
      seen.add(id.value);
    }
    if (HTTP2_ONLY_SETTING_IDS.has(id.value)) {
      throw new H3Error('H3_SETTINGS_ERROR', `SETTINGS: HTTP/2 identifier 0x${id.value.toString(16)} is not allowed in HTTP/3`);
    }
    const v = Math.min(value.value, Number.MAX_SAFE_INTEGER);
    switch (id.value) {
      case SETTING_ID.QPACK_MAX_TABLE_CAPACITY:
        settings.qpackMaxTableCapacity = v;
        break;
      case SETTING_ID.MAX_FIELD_SECTION_SIZE:
        settings.maxFieldSectionSize = v;
        break;
      case SETTING_ID.QPACK_BLOCKED_STREAMS:
        settings.qpackBlockedStreams = v;
        break;
      case SETTING_ID.ENABLE_CONNECT_PROTOCOL:
        settings.enableConnectProtocol = decodeFlag(v, 'SETTINGS_ENABLE_CONNECT_PROTOCOL');
        break;
      case SETTING_ID.H3_DATAGRAM:
        settings.h3Datagram = decodeFlag(v, 'SETTINGS_H3_DATAGRAM');
        break;
      default:
        break; // RFC 9114 §7.2.4: unknown identifiers MUST be ignored.
    }
  }
  return settings;
}

// RFC 9220 §3 / RFC 9297 §2.1.1: boolean settings only take 0 or 1.
function decodeFlag(value: number, name: string): boolean {
  if (value !== 0 && value !== 1) throw new H3Error('H3_SETTINGS_ERROR', `SETTINGS: ${name} must be 0 or 1`);
  return value === 1;
}

/** Options for {@link encodeSettings}. */
export interface EncodeSettingsOptions {
  /** Adds one reserved identifier (RFC 9114 §7.2.4.1) so peers keep ignoring unknown settings; `n` picks it. Default: none. */
  greaseN?: number;
}

/**
 * Encodes a SETTINGS payload. Values equal to the RFC default are omitted (the peer assumes them);
 * `maxFieldSectionSize: Infinity` is therefore not sent.
 */
export function encodeSettingsPayload(settings: Partial<Http3Settings>, options: EncodeSettingsOptions = {}): Uint8Array {
  const pairs: Array<[number, number]> = [];
  const s = { ...DEFAULT_SETTINGS, ...settings };
  if (s.qpackMaxTableCapacity !== 0) pairs.push([SETTING_ID.QPACK_MAX_TABLE_CAPACITY, s.qpackMaxTableCapacity]);
  if (s.maxFieldSectionSize !== Infinity) pairs.push([SETTING_ID.MAX_FIELD_SECTION_SIZE, s.maxFieldSectionSize]);
  if (s.qpackBlockedStreams !== 0) pairs.push([SETTING_ID.QPACK_BLOCKED_STREAMS, s.qpackBlockedStreams]);
  if (s.enableConnectProtocol) pairs.push([SETTING_ID.ENABLE_CONNECT_PROTOCOL, 1]);
  if (s.h3Datagram) pairs.push([SETTING_ID.H3_DATAGRAM, 1]);
  if (options.greaseN !== undefined) pairs.push([reservedCodepoint(options.greaseN), 0]);
  let size = 0;
  for (const [id, value] of pairs) size += varintLength(id) + varintLength(value);
  const out = new Uint8Array(size);
  let at = 0;
  for (const [id, value] of pairs) {
    at = writeVarint(out, at, id);
    at = writeVarint(out, at, value);
  }
  return out;
}

/** True when `id` is a reserved setting identifier (sent only to grease). */
export function isReservedSetting(id: number): boolean {
  return isReservedCodepoint(id);
}
