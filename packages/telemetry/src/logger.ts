// The service logger (pino). `format: json` writes one JSON object per line; `format: plain` turns
// each into `time level msg key=value ...`. The level is live-activatable (`log.level`); format and
// destination are fixed at start (restart-required). Audit events go through `audit()` as JSON
// whatever the format, since `audit.format` is `json`.
import { createWriteStream, openSync } from 'node:fs';
import { Writable } from 'node:stream';
import pino from 'pino';
import type { Logger } from 'pino';

export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal';

export interface LoggerOptions {
  readonly level: LogLevel;
  readonly format: 'json' | 'plain';
  /** Append to this file; default stdout. */
  readonly file?: string;
  /** Destination override (tests). */
  readonly destination?: NodeJS.WritableStream;
  /**
   * Buffer writes and flush asynchronously (workers: no synchronous log I/O on the request path).
   * Applies to stdout and files. Default false.
   */
  readonly async?: boolean;
}

const LEVEL_NAMES: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARN', 50: 'ERROR', 60: 'FATAL' };

/** A stream turning pino's JSON lines into plain `time LEVEL msg k=v` lines. */
function plainStream(out: NodeJS.WritableStream): Writable {
  return new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.length === 0) continue;
        try {
          const { time, level, msg, pid: _pid, hostname: _host, ...rest } = JSON.parse(line) as Record<string, unknown>;
          const kv = Object.entries(rest)
            .map(([k, v]) => `${k}=${typeof v === 'string' && !/\s/.test(v) ? v : JSON.stringify(v)}`)
            .join(' ');
          out.write(`${new Date(Number(time)).toISOString()} ${LEVEL_NAMES[Number(level)] ?? String(level)} ${String(msg ?? '')}${kv.length > 0 ? ` ${kv}` : ''}\n`);
        } catch {
          out.write(`${line}\n`);
        }
      }
      cb();
    },
  });
}

/** The service logger and a raw line writer to the same destination (audit events stay JSON). */
export interface Logging {
  readonly logger: Logger;
  writeLine(line: string): void;
}

/** Creates the service logger. */
export function createLogging(o: LoggerOptions): Logging {
  const out: NodeJS.WritableStream =
    o.destination ??
    (o.async === true
      ? (pino.destination({ dest: o.file ?? 1, sync: false, minLength: 4096, append: true }) as unknown as NodeJS.WritableStream)
      : o.file !== undefined
        ? // Opened now: an unwritable file throws here (with its errno) instead of crashing the process later.
          createWriteStream('', { fd: openSync(o.file, 'a') })
        : process.stdout);
  const dest = o.format === 'plain' ? plainStream(out) : out;
  const logger = pino({ level: o.level, base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.epochTime, messageKey: 'msg' }, dest);
  return { logger, writeLine: (line) => void out.write(line) };
}

/** Creates the service logger alone. */
export function createLogger(o: LoggerOptions): Logger {
  return createLogging(o).logger;
}

export type { Logger };
