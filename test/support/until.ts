// Waiting on a test peer's state: resolves once a predicate holds, checked each time the peer
// says something changed; rejects after a deadline with what the peer saw (the controlled backend,
// the JWKS endpoint and the authorization service all wait this way).
import type { EventEmitter } from 'node:events';

/** Resolves once `pred()` holds (checked now and on every `event` of `changes`); rejects after `timeoutMs` with `failure()`. */
export function until(changes: EventEmitter, event: string, pred: () => boolean, failure: () => string, timeoutMs: number): Promise<void> {
  if (pred()) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const check = (): void => {
      if (!pred()) return;
      clearTimeout(timer);
      changes.off(event, check);
      resolve();
    };
    const timer = setTimeout(() => {
      changes.off(event, check);
      reject(new Error(failure()));
    }, timeoutMs);
    // A wait a test raced and abandoned must not keep the process alive.
    timer.unref();
    changes.on(event, check);
  });
}
