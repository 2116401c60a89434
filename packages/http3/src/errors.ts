// Every HTTP/3 and QPACK error code, declared once as data (RFC 9114 §8.1, RFC 9204 §6).
// Callers branch on `err.code`, never on message text or `instanceof`: errors may cross IPC.

/** Whether an error ends one stream (RESET_STREAM / STOP_SENDING) or the whole connection (CONNECTION_CLOSE). */
export type H3ErrorScope = 'stream' | 'connection';

/** What the registry records about one error code. */
export interface H3ErrorCodeInfo {
  /** The application error code sent on the wire. */
  readonly wireCode: number;
  /** The scope the RFC prescribes when the code is raised for malformed input; a raiser may narrow it. */
  readonly scope: H3ErrorScope;
  /** One line for the error catalogue. */
  readonly description: string;
  /**
   * True for codes raised locally by the session layer (API misuse, timeouts, lost
   * connections). They are never received from a peer; `wireCode` is the code we send when the
   * condition ends a stream or connection.
   */
  readonly local?: boolean;
}

/** The registry of HTTP/3 (RFC 9114 §8.1) and QPACK (RFC 9204 §6) error codes. */
export const H3_ERROR_CODES = {
  H3_NO_ERROR: { wireCode: 0x100, scope: 'connection', description: 'no error; used when closing a connection or stream without an error' },
  H3_GENERAL_PROTOCOL_ERROR: { wireCode: 0x101, scope: 'connection', description: 'the peer violated the protocol in a way no more specific code covers' },
  H3_INTERNAL_ERROR: { wireCode: 0x102, scope: 'connection', description: 'an internal error in the HTTP stack' },
  H3_STREAM_CREATION_ERROR: { wireCode: 0x103, scope: 'connection', description: 'the peer created a stream that is not accepted' },
  H3_CLOSED_CRITICAL_STREAM: { wireCode: 0x104, scope: 'connection', description: 'a stream required by the connection was closed or reset' },
  H3_FRAME_UNEXPECTED: { wireCode: 0x105, scope: 'connection', description: 'a frame was received that is not permitted in the current state or on the current stream' },
  H3_FRAME_ERROR: { wireCode: 0x106, scope: 'connection', description: 'a frame violates layout or size rules' },
  H3_EXCESSIVE_LOAD: { wireCode: 0x107, scope: 'connection', description: 'the peer is exhibiting behaviour that might generate excessive load (a limit was exceeded)' },
  H3_ID_ERROR: { wireCode: 0x108, scope: 'connection', description: 'a stream ID or push ID was used incorrectly' },
  H3_SETTINGS_ERROR: { wireCode: 0x109, scope: 'connection', description: 'a SETTINGS frame carries an invalid or duplicate setting' },
  H3_MISSING_SETTINGS: { wireCode: 0x10a, scope: 'connection', description: 'the control stream did not begin with a SETTINGS frame' },
  H3_REQUEST_REJECTED: { wireCode: 0x10b, scope: 'stream', description: 'the request was rejected without any application processing' },
  H3_REQUEST_CANCELLED: { wireCode: 0x10c, scope: 'stream', description: 'the request or its response was cancelled' },
  H3_REQUEST_INCOMPLETE: { wireCode: 0x10d, scope: 'stream', description: 'the request stream ended before a complete request was received' },
  H3_MESSAGE_ERROR: { wireCode: 0x10e, scope: 'stream', description: 'an HTTP message was malformed' },
  H3_CONNECT_ERROR: { wireCode: 0x10f, scope: 'stream', description: 'the TCP connection for a CONNECT request was reset or abnormally closed' },
  H3_VERSION_FALLBACK: { wireCode: 0x110, scope: 'stream', description: 'the request must be retried over HTTP/1.1' },
  QPACK_DECOMPRESSION_FAILED: { wireCode: 0x200, scope: 'connection', description: 'an encoded field section could not be interpreted' },
  QPACK_ENCODER_STREAM_ERROR: { wireCode: 0x201, scope: 'connection', description: 'an instruction on the QPACK encoder stream could not be interpreted' },
  QPACK_DECODER_STREAM_ERROR: { wireCode: 0x202, scope: 'connection', description: 'an instruction on the QPACK decoder stream could not be interpreted' },
  EDGE_H3_INVALID_USE: {
    wireCode: 0x102, scope: 'stream', local: true,
    description: 'local: the application misused the request/response API (headers already sent, an invalid header name or value, a body longer or shorter than its content-length); when the stream cannot continue it is reset with H3_INTERNAL_ERROR',
  },
  EDGE_H3_FIELD_SECTION_TOO_LARGE: {
    wireCode: 0x102, scope: 'stream', local: true,
    description: "local: a field section to send exceeds the peer's SETTINGS_MAX_FIELD_SECTION_SIZE (RFC 9114 §4.2.2); nothing is sent and the stream is reset with H3_INTERNAL_ERROR",
  },
  EDGE_H3_TIMEOUT: {
    wireCode: 0x10c, scope: 'stream', local: true,
    description: 'local: a handshake, request or response did not complete within its deadline; the stream is cancelled with H3_REQUEST_CANCELLED',
  },
  EDGE_H3_CONNECTION_LOST: {
    wireCode: 0x100, scope: 'connection', local: true,
    description: "local: the QUIC connection failed or closed (handshake failure, idle timeout, transport error, closed by either side) before the exchange completed; the peer's HTTP/3 code, when it sent one, is in the message",
  },
  EDGE_H3_CONTENT_LENGTH_MISMATCH: {
    wireCode: 0x10e, scope: 'stream', local: true,
    description: 'local: a request body is longer than its content-length, or ends (FIN) shorter (RFC 9114 §4.1.2): a malformed message, the stream is reset with H3_MESSAGE_ERROR and the request aborted',
  },
  EDGE_H3_GOAWAY: {
    wireCode: 0x10b, scope: 'stream', local: true,
    description: 'local: the request was not sent, or not processed, because the connection is shutting down (GOAWAY, RFC 9114 §5.2); it is safe to retry on a new connection',
  },
} as const satisfies Record<string, H3ErrorCodeInfo>;

/** A stable error code string, e.g. `H3_FRAME_ERROR`. */
export type H3ErrorCode = keyof typeof H3_ERROR_CODES;

/** Options for {@link H3Error}. */
export interface H3ErrorOptions {
  /** Overrides the registry's scope, e.g. H3_EXCESSIVE_LOAD raised for one oversized request. */
  scope?: H3ErrorScope;
  /** The underlying error, kept for diagnostics. */
  cause?: unknown;
}

/** The only error the codecs throw for bad input. Branch on `.code`. */
export class H3Error extends Error {
  /** Stable code string from {@link H3_ERROR_CODES}. */
  readonly code: H3ErrorCode;
  /** Numeric application error code for RESET_STREAM / CONNECTION_CLOSE. */
  readonly wireCode: number;
  /** Whether the stream or the whole connection must be closed. */
  readonly scope: H3ErrorScope;

  constructor(code: H3ErrorCode, message: string, options: H3ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'H3Error';
    this.code = code;
    this.wireCode = H3_ERROR_CODES[code].wireCode;
    this.scope = options.scope ?? H3_ERROR_CODES[code].scope;
  }
}

/** True when `err` carries one of our codes; works on errors that crossed IPC as plain objects. */
export function isH3Error(err: unknown): err is H3Error {
  if (typeof err !== 'object' || err === null) return false;
  const code = (err as { code?: unknown }).code;
  return typeof code === 'string' && Object.hasOwn(H3_ERROR_CODES, code);
}

const BY_WIRE_CODE = new Map<number, H3ErrorCode>(
  (Object.keys(H3_ERROR_CODES) as H3ErrorCode[])
    .filter((code) => (H3_ERROR_CODES[code] as H3ErrorCodeInfo).local !== true)
    .map((code) => [H3_ERROR_CODES[code].wireCode, code]),
);

/**
 * Name of a received wire error code, or undefined for unknown and reserved codes
 * (RFC 9114 §9: unknown error codes MUST be treated as equivalent to H3_NO_ERROR by the caller).
 */
export function errorCodeFromWire(wireCode: number): H3ErrorCode | undefined {
  return BY_WIRE_CODE.get(wireCode);
}
