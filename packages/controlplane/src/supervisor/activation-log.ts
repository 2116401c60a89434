// One log line per activate / reload outcome (the API's and SIGHUP's): info when it went live,
// error when it was rejected or failed, with every error line; and its count (both paths alike). The lines come from the operation's
// answer, which is already public (activation.ts `publicIssue`: path, code and the code's meaning;
// never a value from the file), so nothing of a candidate file's content reaches the log.
import type { Logger, Metrics } from '@edge-proxy/telemetry';
import type { OperationResult } from '../generations/activation.ts';
import { storedIssue } from '../generations/stored-issue.ts';

/** One error line: where, which code, what it means. */
export interface ErrorLine {
  readonly path: string;
  readonly code: string;
  readonly message: string;
}

interface AnswerBody {
  message?: string;
  config_source?: string;
  plan?: { errors?: ErrorLine[]; rejected_changes?: ErrorLine[]; candidate?: { config_source?: string } };
}

/** Every error line of a rejected or failed activation (empty for one that went live). */
export function errorLines(r: OperationResult): ErrorLine[] {
  const body = r.body as AnswerBody;
  // As stored (stored-issue.ts): the journal is no place for the names of a candidate's unknown keys.
  const lines = [...(body.plan?.errors ?? []), ...(body.plan?.rejected_changes ?? [])].map(storedIssue);
  // A refusal (403 path not allowed, 400 not a file) or a failed prepare/swap has one message.
  if (lines.length === 0 && r.status !== 202) lines.push({ path: '', code: r.reason ?? 'unknown', message: body.message ?? '' });
  return lines;
}

/**
 * Logs the outcome of an activate or reload: `requestedBy` is the actor (`SIGHUP` for the signal),
 * `activeGeneration` what serves after it.
 */
export function logActivation(logger: Logger, operation: 'activate' | 'reload', requestedBy: string, r: OperationResult, activeGeneration: number): void {
  const body = r.body as AnswerBody;
  const source = body.plan?.candidate?.config_source ?? body.config_source;
  const common = { operation, requested_by: requestedBy, status: r.status, ...(source === undefined ? {} : { config_source: source }) };
  // The message starts with a fixed text (`SIGHUP reload`, `activate`, `reload`; then `rejected` or
  // `failed`) for matching; the error lines follow it for whoever reads the journal.
  const label = requestedBy === 'SIGHUP' ? 'SIGHUP reload' : operation;
  if (r.status === 202) {
    logger.info({ ...common, generation: r.generation ?? activeGeneration }, label);
    return;
  }
  const errors = errorLines(r);
  const summary = errors.map((e) => `${e.path === '' ? '(document)' : e.path}: ${e.code}: ${e.message}`).join('; ');
  logger.error({ ...common, reason: r.reason ?? 'unknown', active_generation: activeGeneration, errors }, `${label} ${r.status >= 500 ? 'failed' : 'rejected'}: ${r.reason ?? 'unknown'}, generation ${activeGeneration} keeps serving; ${summary}`);
}

/** Counts an activate or reload outcome: `svc_runtime_activation_total{result,reason}`, and `svc_runtime_rejections_total{reason}` unless it went live. */
export function countActivation(metrics: Metrics, r: OperationResult): void {
  const result = r.status === 202 ? 'success' : r.status >= 500 ? 'failure' : 'rejected';
  metrics.counter('svc_runtime_activation_total').inc({ result, reason: r.reason ?? (result === 'success' ? 'activated' : 'unknown') });
  if (r.status !== 202) metrics.counter('svc_runtime_rejections_total').inc({ reason: r.reason ?? 'unknown' });
}
