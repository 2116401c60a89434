// A logger whose JSON lines a test reads back: `lines` holds each parsed line, `wrote` emits
// 'line' after each write (await it rather than sleep).
import { EventEmitter } from 'node:events';
import { Writable } from 'node:stream';
import { createLogger } from '@edge-proxy/telemetry';
import type { Logger } from '@edge-proxy/telemetry';

export interface JsonLog {
  readonly lines: Record<string, unknown>[];
  readonly wrote: EventEmitter;
  readonly logger: Logger;
}

export function jsonLog(level: 'debug' | 'info' | 'warn' = 'info'): JsonLog {
  const lines: Record<string, unknown>[] = [];
  const wrote = new EventEmitter();
  const sink = new Writable({
    write(chunk: Buffer, _e, cb) {
      for (const l of chunk.toString().split('\n')) if (l.length > 0) lines.push(JSON.parse(l) as Record<string, unknown>);
      wrote.emit('line');
      cb();
    },
  });
  return { lines, wrote, logger: createLogger({ level, format: 'json', destination: sink }) };
}
