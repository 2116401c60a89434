// Audit events (SPEC "Events"), schema v1: the control-plane event history. Every event has every
// stable top-level field (null when it does not apply), so consumers can rely on the shape. An
// event never carries a token, a header value or secret bytes: builders take identities and
// reasons, not requests.
import { randomUUID } from 'node:crypto';

export const AUDIT_SCHEMA_VERSION = 'v1';

/** `event_type` values (SPEC: "not shown"; declared here). */
export const AUDIT_EVENT_TYPES = ['authentication', 'authorization', 'operation_attempt', 'operation_result', 'material'] as const;
export type AuditEventType = (typeof AUDIT_EVENT_TYPES)[number];

/** `action` values: the operations, plus the four material actions the specification names. */
export const AUDIT_ACTIONS = [
  'authenticate',
  'authorize',
  'validate',
  'preview',
  'activate',
  'rollback',
  'reload',
  'restart',
  'cert_reload',
  'read',
  'cert_reload_applied',
  'secret_resolution_failed',
  'upstream_mtls_material_changed',
  'upstream_mtls_material_invalid',
] as const;
export type AuditAction = (typeof AUDIT_ACTIONS)[number];

/** `result` values. */
export type AuditResult = 'attempted' | 'succeeded' | 'denied' | 'failed';

/** The stable top-level fields, in SPEC order. */
export const AUDIT_FIELDS = [
  'schema_version',
  'event_id',
  'event_type',
  'time_unix_ms',
  'request_id',
  'trace_id',
  'span_id',
  'listener',
  'actor',
  'action',
  'target',
  'generation',
  'result',
  'reason',
  'failure_class',
  'peer_addr',
  'authn',
] as const;

export interface AuditActor {
  /** `actor_id` of the token, CN of the certificate, or `anonymous`. */
  readonly id: string;
  readonly roles: readonly string[];
  /** `requested_by` from the request body, when given: printable, bounded, a note and not an identity. */
  readonly requested_by_note?: string;
}

export interface AuditEvent {
  readonly schema_version: 'v1';
  readonly event_id: string;
  readonly event_type: AuditEventType;
  readonly time_unix_ms: number;
  readonly request_id: string | null;
  readonly trace_id: string | null;
  readonly span_id: string | null;
  readonly listener: string | null;
  readonly actor: AuditActor | null;
  readonly action: AuditAction;
  readonly target: string | null;
  readonly generation: number | null;
  readonly result: AuditResult;
  readonly reason: string | null;
  readonly failure_class: string | null;
  readonly peer_addr: string | null;
  readonly authn: string | null;
  /** For a result event: the `event_id` of its attempt (attempt/result correlation). */
  readonly attempt_event_id?: string;
}

export type AuditInput = Partial<Omit<AuditEvent, 'schema_version' | 'event_id' | 'time_unix_ms'>> & Pick<AuditEvent, 'event_type' | 'action' | 'result'>;

/** Builds an event with every stable field; `now` and `id` are injectable for tests. */
export function auditEvent(input: AuditInput, now: () => number = Date.now, id: () => string = randomUUID): AuditEvent {
  return {
    schema_version: AUDIT_SCHEMA_VERSION,
    event_id: id(),
    event_type: input.event_type,
    time_unix_ms: now(),
    request_id: input.request_id ?? null,
    trace_id: input.trace_id ?? null,
    span_id: input.span_id ?? null,
    listener: input.listener ?? null,
    actor: input.actor ?? null,
    action: input.action,
    target: input.target ?? null,
    generation: input.generation ?? null,
    result: input.result,
    reason: input.reason ?? null,
    failure_class: input.failure_class ?? null,
    peer_addr: input.peer_addr ?? null,
    authn: input.authn ?? null,
    ...(input.attempt_event_id === undefined ? {} : { attempt_event_id: input.attempt_event_id }),
  };
}

/** Where audit events go: one JSON object per line on the service log (`sink: log`, `format: json`). */
export type AuditSink = (event: AuditEvent) => void;

/** A sink writing `{"audit":true,...event}` lines to a writable. */
export function logAuditSink(write: (line: string) => void): AuditSink {
  return (event) => write(`${JSON.stringify({ audit: true, ...event })}\n`);
}
