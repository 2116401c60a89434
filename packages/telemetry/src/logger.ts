// The service logger (pino). `format: json` writes one JSON object per line; `format: plain` turns
// each into `time LEVEL [who] msg key=value ...`. Every line carries its level as a string
// ("level":"warn"), an ISO-8601 `time`, the process `pid` and who wrote it (`role`: supervisor or
// worker, and a worker's slot index as `worker`). Under systemd's journal (journal.ts) every line
// starts with its `<N>` syslog priority, which journald turns into PRIORITY and strips, and plain
// lines leave the timestamp to journald. The level is live-activatable (`log.level`); format and
// destination are fixed at start (restart-required). Audit events go through `writeLine` as JSON
// whatever the format, since `audit.format` is `json`.
import { createWriteStream, openSync } from 'node:fs';
import { Writable } from 'node:stream';
import pino from 'pino';
import type { Logger } from 'pino';
import { isJournalStream, jsonLinePrefix, syslogPrefix } from './journal.ts';

export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal';

export interface LoggerOptions {
  readonly level: LogLevel;
  readonly format: 'json' | 'plain';
  /** Append to this file; default stdout. */
  readonly file?: string;
  /** Destination override (tests). */
  readonly destination?: NodeJS.WritableStream;
  /**
   * Buffer writes and flush asynchronously (workers: no synchronous log I/O on the request path),
   * at the latest every {@link ASYNC_FLUSH_MS}. Applies to stdout and files. Default false.
   */
  readonly async?: boolean;
  /** Fields on every line: `{ role: 'supervisor' }`, `{ role: 'worker', worker: 0 }`. Default none. */
  readonly fields?: Readonly<Record<string, string | number>>;
  /**
   * Write for systemd's journal (`<N>` priority prefixes; no timestamp on plain lines). Default:
   * when the destination is stdout and stdout is the stream `$JOURNAL_STREAM` names.
   */
  readonly journal?: boolean;
}

/** Longest an asynchronous logger holds a line before writing it, ms. */
export const ASYNC_FLUSH_MS = 250;

/** The `[who]` tag of a plain line, and the fields it stands for (not repeated as key=value). */
function plainTag(rest: Record<string, unknown>): string {
  const role = rest['role'];
  if (role === undefined) return '';
  delete rest['role'];
  if (role !== 'worker' || rest['worker'] === undefined) return `[${String(role)}] `;
  const tag = `[worker ${String(rest['worker'])}] `;
  delete rest['worker'];
  return tag;
}

/** A writable that `logger.flush()` flushes through to its destination (a buffered one, in workers). */
type Flushable = NodeJS.WritableStream & { flush?: (cb: (err?: Error) => void) => void };

/** A stream turning pino's JSON lines into plain `time LEVEL [who] msg k=v` lines (`<N>LEVEL ...` for the journal). */
function plainStream(out: Flushable, journal: boolean): Writable {
  const w = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.length === 0) continue;
        try {
          const { time, level, msg, pid: _pid, hostname: _host, ...rest } = JSON.parse(line) as Record<string, unknown>;
          const label = String(level);
          const tag = plainTag(rest);
          const kv = Object.entries(rest)
            .map(([k, v]) => `${k}=${typeof v === 'string' && !/\s/.test(v) ? v : JSON.stringify(v)}`)
            .join(' ');
          const head = journal ? syslogPrefix(label) : `${String(time)} `;
          out.write(`${head}${label.toUpperCase()} ${tag}${String(msg ?? '')}${kv.length > 0 ? ` ${kv}` : ''}\n`);
        } catch {
          out.write(`${line}\n`);
        }
      }
      cb();
    },
  });
  return Object.assign(w, { flush: (cb: (err?: Error) => void) => (out.flush === undefined ? cb() : out.flush(cb)) });
}

/** The service logger and a raw line writer to the same destination (audit events stay JSON). */
export interface Logging {
  readonly logger: Logger;
  writeLine(line: string): void;
  /**
   * Settles once the destination is open (an `async` file is opened in the background). A worker
   * waits for it before it drops privileges: the file may be writable by root only.
   */
  readonly opened: Promise<void>;
}

/** When an asynchronously opened destination (sonic-boom, fd -1 until open) is open or failed. */
function openedOf(out: NodeJS.WritableStream): Promise<void> {
  const boom = out as unknown as { fd?: number; once?: (event: string, f: () => void) => void };
  if (typeof boom.fd !== 'number' || boom.fd >= 0 || boom.once === undefined) return Promise.resolve();
  return new Promise((resolve) => {
    boom.once?.('ready', resolve);
    boom.once?.('error', resolve);
  });
}

/**
 * A log destination that fails later (EPIPE: the reader of a piped stdout is gone; EIO, ENOSPC on
 * a file) must not take the service down with an unhandled stream error: serving goes on, its log
 * lines are lost from then on, and that is said once on stderr (if stderr can still be written).
 */
function surviveFailure(out: NodeJS.WritableStream, what: string): void {
  let said = false;
  out.on('error', (err: NodeJS.ErrnoException) => {
    if (said) return;
    said = true;
    try {
      // stderr is often the same broken pipe: its failure must not be unhandled either.
      process.stderr.on('error', () => {});
      if (out !== process.stderr) process.stderr.write(`edge-proxy: log destination ${what} failed (${err.code ?? err.message}): log lines are lost from now on; the service keeps running\n`);
    } catch {
      /* stderr is gone too */
    }
  });
}

/** Creates the service logger. */
export function createLogging(o: LoggerOptions): Logging {
  const out: Flushable =
    o.destination ??
    (o.async === true
      ? (pino.destination({ dest: o.file ?? 1, sync: false, minLength: 4096, periodicFlush: ASYNC_FLUSH_MS, append: true }) as unknown as NodeJS.WritableStream)
      : o.file !== undefined
        ? // Opened now: an unwritable file throws here (with its errno) instead of crashing the process later.
          createWriteStream('', { fd: openSync(o.file, 'a') })
        : process.stdout);
  if (o.destination === undefined) surviveFailure(out, o.file ?? 'stdout');
  const journal = o.journal ?? (o.destination === undefined && o.file === undefined && isJournalStream());
  const dest = o.format === 'plain' ? plainStream(out, journal) : out;
  const logger = pino(
    {
      level: o.level,
      base: { pid: process.pid, ...o.fields },
      // Labels, not pino's numbers (30, 40): what journald, Loki, Elastic and people read.
      formatters: { level: (label) => ({ level: label }) },
      timestamp: pino.stdTimeFunctions.isoTime,
      messageKey: 'msg',
      // JSON for the journal: the priority prefix, read off the line's leading level.
      ...(journal && o.format === 'json' ? { hooks: { streamWrite: (s: string) => `${jsonLinePrefix(s)}${s}` } } : {}),
    },
    dest,
  );
  return { logger, writeLine: (line) => void out.write(line), opened: openedOf(out) };
}

/** Creates the service logger alone. */
export function createLogger(o: LoggerOptions): Logger {
  return createLogging(o).logger;
}

export type { Logger };
