// Request ids (`x-request-id`, `observability.request_id`): every request gets one, kept from the
// client when it is well-formed and `accept_incoming` allows it, else generated (a random UUID,
// RFC 9562 version 4). The id is sent upstream in `x-request-id` (replacing whatever the client
// sent), written in access and route-decision logs and spans, and returned on the proxy's own
// error answers, so that an operator can follow one request from the client's report to the
// backend's log.
//
// An accepted id is a short token of characters that cannot break a log line, a header or a
// metric label: 1 to 128 of `A-Z a-z 0-9 - _ . : + / = @`. Anything else (too long, a space, a
// quote, a control character, a repeated header) is replaced, never escaped and kept.
import { randomUUID } from 'node:crypto';

/** The header carrying the id, both ways. */
export const REQUEST_ID_HEADER = 'x-request-id';

/** Longest accepted incoming id. */
export const REQUEST_ID_MAX = 128;

const VALID = /^[A-Za-z0-9\-_.:+/=@]{1,128}$/;

/** Whether `value` (a header as node gives it) is an id the proxy keeps. */
export function acceptableRequestId(value: string | string[] | undefined): value is string {
  return typeof value === 'string' && value.length <= REQUEST_ID_MAX && VALID.test(value);
}

/** The request's id: the client's when acceptable and `acceptIncoming`, else a new UUID. */
export function requestIdOf(value: string | string[] | undefined, acceptIncoming: boolean): string {
  return acceptIncoming && acceptableRequestId(value) ? value : randomUUID();
}
