// What the request path asks of tracing (`observability.tracing`), declared here so that the data
// plane depends on this small surface and never on the OpenTelemetry SDK: a server span per
// request, a client span per upstream attempt (a retry and a hedge each get their own), the
// `traceparent` each attempt carries upstream, and the facts both spans end with. With tracing
// off there is no tracer at all: the request path checks one field and builds nothing.
//
// The facts are the ones the access log writes (`RequestFacts`), so a log line and a span of the
// same request tell the same story with the same correlation fields (SPEC "Events": request_id,
// trace_id, span_id, generation, listener, route, upstream, backend, reason, failure_class).

/** Header fields as node presents them (lower-case names). */
export type TraceHeaders = Record<string, string | string[] | undefined>;

/** What is known of a request when its span starts (after validation: the normalized target). */
export interface RequestStart {
  readonly requestId: string;
  readonly method: string;
  /** Path without its query string (which may carry credentials). */
  readonly path: string;
  readonly authority: string | undefined;
  /** `1.1`, `2` or `3`. */
  readonly protocol: string;
  readonly listener: string;
  readonly clientAddress: string;
  readonly generation: number;
}

/** What is known of an upstream attempt when its span starts. */
export interface AttemptStart {
  /** 1 for the first attempt, then 2, 3, ... (retries and hedges alike). */
  readonly attempt: number;
  readonly hedge: boolean;
  readonly upstream: string;
  /** The backend's configured id. */
  readonly backend: string;
  readonly host: string;
  readonly port: number;
}

/** How an attempt ended. */
export interface AttemptFacts {
  /** The backend's status; undefined when no response head arrived. */
  readonly status: number | undefined;
  /** `success`, `failure`, `timeout`, `backend_error`. */
  readonly outcome: string;
  /** Why it failed (`connect_timeout`, `transport`, `status_503`, `lost`, ...); undefined on success. */
  readonly reason: string | undefined;
}

/** How a request ended: the access log line and the server span's attributes. */
export interface RequestFacts {
  /** Status answered downstream; 0 when nothing was answered (the client went away). */
  readonly status: number;
  /** `success`, `failure`, `timeout`, `backend_error`, `overload_shed`, `rate_limited`. */
  readonly outcome: string;
  /** The error code answered (`EDGE_*`), or undefined. */
  readonly code: string | undefined;
  /** Why: a shed, denial or failure reason; undefined on success. */
  readonly reason: string | undefined;
  /** The failure class of the error (errors.ts `FailureClass`), or undefined. */
  readonly failureClass: string | undefined;
  /** The route's upstream pool, once routed. */
  readonly upstream: string | undefined;
  /** The backend that answered (or last failed), once one was picked. */
  readonly backend: string | undefined;
  /** Upstream attempts made (0: none). */
  readonly attempts: number;
  readonly bytesIn: number;
  readonly bytesOut: number;
  /** Milliseconds from the request's arrival to its end. */
  readonly durationMs: number;
}

/** The client span of one upstream attempt. */
export interface AttemptSpan {
  /** Ends the span (once; later calls are ignored). */
  end(facts: AttemptFacts): void;
}

/** The server span of one request. */
export interface RequestSpan {
  /** The trace this request belongs to (32 hex digits): the caller's, or a new one. */
  readonly traceId: string;
  /** This request's span (16 hex digits). */
  readonly spanId: string;
  /**
   * Starts the client span of an attempt and writes its `traceparent` (and the caller's
   * `tracestate`) into `headers`, the request headers sent upstream.
   */
  startAttempt(start: AttemptStart, headers: TraceHeaders): AttemptSpan;
  /** Ends the span (once; later calls are ignored). */
  end(facts: RequestFacts): void;
}

/** The tracer of a worker (present only when `observability.tracing.enabled`). */
export interface RequestTracer {
  /**
   * Starts the server span of a request whose headers are `headers`: a child of a valid incoming
   * `traceparent` (W3C), else a new trace; sampled with `sample_ratio` (a caller's flag decides
   * only with `trust_incoming_sampling`). Never throws.
   */
  startRequest(headers: TraceHeaders, start: RequestStart): RequestSpan;
  /** Exports what is buffered and stops (worker shutdown); resolves within `timeoutMs`. */
  shutdown(timeoutMs: number): Promise<void>;
}
