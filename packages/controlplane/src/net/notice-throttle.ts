// At most one notice (log line, audit event) per kind and interval for events an attacker can
// produce at will (refused, dropped or timed-out connections): the line that is written counts
// the ones it stood for, so a flood is visible without flooding the log.

export class NoticeThrottle {
  private readonly intervalMs: number;
  private readonly last = new Map<string, { at: number; suppressed: number }>();

  constructor(intervalMs: number) {
    this.intervalMs = intervalMs;
  }

  /**
   * Whether a notice of `kind` may be written now: the number of notices suppressed since the
   * last one written, or undefined when this one is suppressed too.
   */
  admit(kind: string, now = performance.now()): number | undefined {
    const n = this.last.get(kind) ?? { at: -Infinity, suppressed: 0 };
    this.last.set(kind, n);
    if (now - n.at < this.intervalMs) {
      n.suppressed++;
      return undefined;
    }
    const suppressed = n.suppressed;
    n.at = now;
    n.suppressed = 0;
    return suppressed;
  }
}
