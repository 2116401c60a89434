// The part of the supervisor–worker contract carried in a worker's environment at fork: what the
// worker does to its own process (issue 12 item 5). Set by the supervisor
// (controlplane supervisor/process-keys.ts), read by the worker (dataplane worker/process-setup.ts).

/** The supervisor's CPU list (`0,1,2`): worker i pins itself to the (i mod n)-th. Unset: no pinning. */
export const WORKER_CPUS_ENV = 'EDGE_WORKER_CPUS';
/** The account to switch to after binding, a DropTarget as JSON. Unset: no switch. */
export const WORKER_DROP_ENV = 'EDGE_WORKER_DROP';
/**
 * `1`: this process only fills Node's compile cache (controlplane supervisor/compile-cache.ts): it
 * loads the worker's modules and exits 0 before doing anything else.
 */
export const WORKER_WARMUP_ENV = 'EDGE_WORKER_WARMUP';

/** The account a worker switches to: numeric ids resolved by the supervisor, the user name for its groups. */
export interface DropTarget {
  readonly user?: string;
  readonly uid?: number;
  readonly gid: number;
}
