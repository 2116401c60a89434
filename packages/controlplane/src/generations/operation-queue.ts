// Control operations run one at a time, each under a deadline and on behalf of a caller that may
// leave. An operation is carried out only if, when its turn comes, its caller is still there and
// its deadline has not passed; one abandoned while it waits leaves the queue at once (its caller
// is answered, or is gone) and is skipped when its turn comes. Once running, the operation checks
// its signal at its own checkpoints (`checkpoint`) up to the point where it starts changing state.

/** Why an operation was not carried out. */
export type AbandonReason = 'caller_gone' | 'deadline_exceeded';

/** The reason a caller's signal is aborted with. */
export class OperationAbort extends Error {
  readonly code: AbandonReason;
  constructor(code: AbandonReason) {
    super(code === 'caller_gone' ? 'the caller disconnected' : 'the operation deadline passed');
    this.name = 'OperationAbort';
    this.code = code;
  }
}

/** Thrown when an operation is abandoned: while `queued`, or at a checkpoint while `running`. */
export class OperationAbandoned extends Error {
  readonly code = 'EDGE_OPERATION_ABANDONED';
  readonly reason: AbandonReason;
  readonly phase: 'queued' | 'running';
  constructor(reason: AbandonReason, phase: 'queued' | 'running') {
    super(`operation abandoned while ${phase}: ${reason}`);
    this.name = 'OperationAbandoned';
    this.reason = reason;
    this.phase = phase;
  }
}

function reasonOf(signal: AbortSignal): AbandonReason {
  const r = signal.reason as { code?: string } | undefined;
  return r?.code === 'caller_gone' ? 'caller_gone' : 'deadline_exceeded';
}

/** Throws OperationAbandoned (phase `running`) when `signal` has been aborted. */
export function checkpoint(signal: AbortSignal | undefined): void {
  if (signal?.aborted === true) throw new OperationAbandoned(reasonOf(signal), 'running');
}

/**
 * A signal aborted with OperationAbort `deadline_exceeded` after `ms`, or earlier with
 * `caller_gone` through the returned `callerGone()`. `dispose()` clears the timer.
 */
export function operationSignal(ms: number): { signal: AbortSignal; callerGone(): void; dispose(): void } {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(new OperationAbort('deadline_exceeded')), ms);
  timer.unref();
  return {
    signal: ac.signal,
    callerGone: () => ac.abort(new OperationAbort('caller_gone')),
    dispose: () => clearTimeout(timer),
  };
}

export class OperationQueue {
  private tail: Promise<void> = Promise.resolve();
  private waiting = 0;

  /** Operations waiting for their turn (not counting the running one). */
  get queued(): number {
    return this.waiting;
  }

  /** Runs `f` after every operation queued before it, unless `signal` aborts first. */
  run<T>(signal: AbortSignal | undefined, f: () => Promise<T>): Promise<T> {
    const turn = this.tail;
    let done!: () => void;
    this.tail = new Promise<void>((r) => (done = r));
    this.waiting++;
    return new Promise<T>((resolve, reject) => {
      let pending = true;
      const onAbort = (): void => {
        if (!pending) return;
        pending = false;
        this.waiting--;
        reject(new OperationAbandoned(reasonOf(signal as AbortSignal), 'queued'));
      };
      if (signal?.aborted === true) onAbort();
      else signal?.addEventListener('abort', onAbort, { once: true });
      void turn.then(async () => {
        signal?.removeEventListener('abort', onAbort);
        if (!pending) return done(); // abandoned while queued: never carried out
        pending = false;
        this.waiting--;
        try {
          resolve(await f());
        } catch (e) {
          reject(e);
        } finally {
          done();
        }
      });
    });
  }
}
