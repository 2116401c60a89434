// The audit event line (SPEC "Events", schema v1) as the tests expect it, declared once and
// independently of packages/telemetry/src/audit.ts: every stable field present (null when it does
// not apply), each with its type, nothing else. `auditSchemaErrors` checks any number of logged
// events and lists every deviation, so a test makes one assertion however many events there are.
import { Type } from '@sinclair/typebox';
import type { TSchema } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Uuid = Type.String({ pattern: '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' });
const Text = Type.String({ minLength: 1 });

export const AuditLine = Type.Object(
  {
    audit: Type.Literal(true),
    schema_version: Type.Literal('v1'),
    event_id: Uuid,
    event_type: Type.Union(['authentication', 'authorization', 'operation_attempt', 'operation_result', 'material'].map((v) => Type.Literal(v))),
    // After 2020-09-13 (1.6e12 ms): milliseconds, not seconds (the future is checked below).
    time_unix_ms: Type.Integer({ minimum: 1.6e12 }),
    request_id: Nullable(Text),
    trace_id: Nullable(Text),
    span_id: Nullable(Text),
    listener: Nullable(Text),
    actor: Nullable(Type.Object({ id: Text, roles: Type.Array(Type.Union(['viewer', 'operator', 'admin'].map((v) => Type.Literal(v)))), requested_by_note: Type.Optional(Type.String()) }, { additionalProperties: false })),
    action: Text,
    target: Nullable(Text),
    generation: Nullable(Type.Integer({ minimum: 1 })),
    result: Type.Union(['attempted', 'succeeded', 'denied', 'failed'].map((v) => Type.Literal(v))),
    reason: Nullable(Text),
    failure_class: Nullable(Text),
    peer_addr: Nullable(Text),
    authn: Nullable(Type.Union(['bearer', 'mtls', 'mtls+bearer', 'none'].map((v) => Type.Literal(v)))),
    attempt_event_id: Type.Optional(Uuid),
  },
  { additionalProperties: false },
);

/** Every deviation from `AuditLine` in `events`, as `#<index> <action> <path>: <message>`; [] when all conform. */
export function auditSchemaErrors(events: readonly unknown[]): string[] {
  const out: string[] = [];
  events.forEach((e, i) => {
    for (const err of Value.Errors(AuditLine, e)) out.push(`#${i} ${String((e as { action?: unknown }).action)} ${err.path || '/'}: ${err.message}`);
    const at = (e as { time_unix_ms?: unknown }).time_unix_ms;
    if (typeof at === 'number' && at > Date.now() + 86_400_000) out.push(`#${i} /time_unix_ms: in the future`);
  });
  return out;
}
