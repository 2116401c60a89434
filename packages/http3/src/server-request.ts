// The request side of an HTTP/3 exchange as the application sees it: a Readable of the body,
// shaped like Node's `http2.Http2ServerRequest` (method, url, authority, scheme, headers with
// pseudo-headers, rawHeaders, trailers, httpVersion, socket, 'aborted').

import { Readable } from 'node:stream';
import type { IncomingHeaders } from './header-object.ts';
import type { Http3ConnectionInfo } from './quic-adapter.ts';

/** What the request needs from its stream: resume reading when the application wants more. */
export interface RequestBodySource {
  /** Called when the body buffer has room again (Readable._read). */
  resume(): void;
}

/** Construction data of {@link Http3ServerRequest}. */
export interface ServerRequestInit {
  streamId: number;
  method: string;
  scheme: string | undefined;
  authority: string;
  path: string | undefined;
  headers: IncomingHeaders;
  rawHeaders: string[];
  socket: Http3ConnectionInfo;
  source: RequestBodySource;
  /** Body buffer before backpressure applies, bytes. */
  highWaterMark: number;
}

/**
 * An incoming HTTP/3 request (RFC 9114 §4.1). The body streams as Buffers; `trailers` is filled
 * before 'end'. When the client cancels, 'aborted' is emitted and the stream is destroyed; like
 * Node's IncomingMessage, the error is emitted only if an 'error' listener exists.
 */
export class Http3ServerRequest extends Readable {
  /** QUIC stream ID of the request (client-initiated bidirectional, RFC 9000 §2.1). */
  readonly streamId: number;
  /** :method. */
  readonly method: string;
  /** :scheme; undefined for CONNECT. */
  readonly scheme: string | undefined;
  /** :authority (or host); '' when absent. */
  readonly authority: string;
  /** :path as sent (origin-form); '' for CONNECT. */
  readonly url: string;
  /** All field lines as an object; pseudo-headers included, as in Node's http2 API. */
  readonly headers: IncomingHeaders;
  /** Field lines as [name, value, name, value, ...]. */
  readonly rawHeaders: string[];
  /** Trailer fields, filled when they arrive (before 'end'). */
  trailers: IncomingHeaders = Object.create(null) as IncomingHeaders;
  /** Trailer lines as [name, value, ...]. */
  rawTrailers: string[] = [];
  /** Always '3.0'. */
  readonly httpVersion = '3.0';
  readonly httpVersionMajor = 3;
  readonly httpVersionMinor = 0;
  /** Connection facts: addresses, SNI, ALPN, connection IDs, resumption. */
  readonly socket: Http3ConnectionInfo;
  /** True once the client cancelled the request (RESET_STREAM / STOP_SENDING). */
  aborted = false;
  /** True once the whole body and trailers were received. */
  complete = false;
  private readonly source: RequestBodySource;

  constructor(init: ServerRequestInit) {
    super({ highWaterMark: init.highWaterMark });
    this.streamId = init.streamId;
    this.method = init.method;
    this.scheme = init.scheme;
    this.authority = init.authority;
    this.url = init.path ?? '';
    this.headers = init.headers;
    this.rawHeaders = init.rawHeaders;
    this.socket = init.socket;
    this.source = init.source;
  }

  /** Same as `socket`, for code written against Node's older `req.connection`. */
  get connection(): Http3ConnectionInfo {
    return this.socket;
  }

  /** Path and query, same as `url`. */
  get path(): string {
    return this.url;
  }

  override _read(): void {
    this.source.resume();
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    // Node's IncomingMessage pattern: a peer abort must not crash an application that does
    // not listen for 'error'; it sees 'aborted' and 'close' instead.
    callback(err !== null && this.listenerCount('error') > 0 ? err : null);
  }

  /** @internal Body bytes from the stream; false means "stop reading until _read". */
  pushBody(chunk: Buffer): boolean {
    return this.push(chunk);
  }

  /** @internal The body ended cleanly. */
  endBody(): void {
    this.complete = true;
    this.push(null);
  }

  /** @internal The client cancelled, or the stream failed, before the body was complete. */
  abort(err: Error): void {
    if (this.aborted || this.complete) return;
    this.aborted = true;
    this.emit('aborted');
    this.destroy(err);
  }
}
