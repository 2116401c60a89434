// Rules on the process model (`performance.reuseport`): what the workers can honour.
import { issue } from '../errors.ts';
import type { ConfigIssue } from '../errors.ts';
import type { Rule } from './context.ts';

/**
 * `reuseport: false` binds one socket per listener and protocol, without SO_REUSEPORT. Several
 * workers would then share one UDP socket, and each QUIC datagram would go to whichever worker
 * reads it first: a connection's packets would be split between processes that do not share its
 * state. Only SO_REUSEPORT's 4-tuple hash keeps them on one worker, so `false` needs exactly one.
 */
const reuseport: Rule = {
  name: 'reuseport',
  check(ctx): ConfigIssue[] {
    const p = ctx.doc.performance;
    if (p === undefined || p === null || p.reuseport !== false || p.worker_threads === 1) return [];
    return [
      issue(
        'performance.reuseport',
        'EDGE_CONFIG_REUSEPORT',
        `reuseport: false needs worker_threads: 1 (${p.worker_threads === undefined ? 'unset: one worker per CPU' : `it is ${String(p.worker_threads)}`}); several workers on one shared UDP socket would split QUIC connections between them`,
      ),
    ];
  },
};

export const PROCESS_RULES: readonly Rule[] = [reuseport];
