// A second, independent HTTP/3 client for `npm run bench:proxy`: headless Debian Chromium, whose
// QUIC and HTTP/3 stack (Google's) shares no code with ngtcp2's gtlsclient or with our library.
// The page's own `fetch` makes the requests; Chromium is forced onto QUIC for the proxies' origins
// and trusts the benchmark's certificate by its public key hash.
//
// Driven over the DevTools protocol with Node's WebSocket, the Runtime and Target domains only:
// Playwright enables the Network domain on every page, and its per-request events (sent to the
// driver process) halved the rate Chromium could ask (about 550 against 1,100 req/s on this
// machine, both cores). Even so Chromium is the slower side: pinned to one core it asks 500-650
// requests a second, a sixth to a tenth of what one proxy core serves, so its rounds compare the
// proxies' CPU per request at the same (client-bound) rate rather than their peak throughput.
//
// - one connection: a fresh browser context per round (so a fresh QUIC connection), the page
//   loaded from the proxy, then `concurrency` fetch loops share `n` requests on that connection;
// - many connections: `contexts` browser contexts, each its own network context and so its own
//   QUIC connection, each with a page loaded once; before every one of `waves` waves each context
//   closes its connections (`chrome.benchmarking.closeConnections`, from `--enable-net-benchmarking`),
//   so every wave opens `contexts` new connections (full handshakes) for `perContext` requests each.
// After a page load Chromium also asks for `/favicon.ico`: one request per page that the proxy
// serves and the counts leave out (one in 3,000 on one connection; none during the waves).
// Every fetch and every page load must come back 200 over h3 (the page's resource timing says
// which protocol carried it); anything else counts as an error. Each step has a deadline.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createHash, X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { LoadResult } from './bench-load.ts';
import { percentile } from './bench-load.ts';

/** Base64 SHA-256 of a certificate's SubjectPublicKeyInfo: what Chromium's `--ignore-certificate-errors-spki-list` takes. */
export function spkiHash(certPem: string | Buffer): string {
  const cert = new X509Certificate(certPem);
  return createHash('sha256').update(cert.publicKey.export({ type: 'spki', format: 'der' })).digest('base64');
}

interface CdpReply {
  readonly id?: number;
  readonly result?: Record<string, unknown>;
  readonly error?: { readonly message: string };
}

/** The fetch loop's report, as the page returns it. */
interface PageReport {
  readonly ok: number;
  readonly failed: number;
  readonly notH3: number;
  readonly seconds: number;
  readonly latencies: number[];
  /** How the requests that did not come over h3 came (at most a few), for the log. */
  readonly protocols?: readonly string[];
}

const STEP_MS = 30_000;

/** Chromium on one core, driven over the DevTools protocol. `close()` ends it and removes its profile. */
export class BrowserLoad {
  private nextId = 0;
  /** The pages of `manyConnections`, one per browser context, by origin. */
  private readonly pools = new Map<string, Array<{ context: string; session: string }>>();
  private readonly pending = new Map<number, { resolve: (r: Record<string, unknown>) => void; reject: (e: Error) => void }>();

  private readonly proc: ChildProcess;
  private readonly ws: WebSocket;
  private readonly profileDir: string;
  private readonly onExit: () => void;

  private constructor(proc: ChildProcess, ws: WebSocket, profileDir: string, onExit: () => void) {
    this.proc = proc;
    this.ws = ws;
    this.profileDir = profileDir;
    this.onExit = onExit;
    ws.addEventListener('message', (e) => {
      const m = JSON.parse(String(e.data)) as CdpReply;
      if (m.id === undefined) return;
      const p = this.pending.get(m.id);
      if (p === undefined) return;
      this.pending.delete(m.id);
      if (m.error !== undefined) p.reject(new Error(`chromium: ${m.error.message}`));
      else p.resolve(m.result ?? {});
    });
    ws.addEventListener('close', () => this.failAll(new Error('chromium: the DevTools connection closed')));
  }

  /**
   * Starts Chromium pinned to `core`, with QUIC forced for each of `origins` (`host:port`) and the
   * certificate whose SPKI hash is `spki` trusted. Every other name resolves to nothing, and
   * Chromium's background traffic is off: nothing leaves the loopback.
   */
  static async launch(executable: string, core: number, origins: readonly string[], spki: string): Promise<BrowserLoad> {
    const profileDir = mkdtempSync(path.join(tmpdir(), 'bench-chromium-'));
    const args = [
      '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-extensions', '--mute-audio',
      '--enable-net-benchmarking', '--remote-debugging-port=0', `--user-data-dir=${profileDir}`,
      `--origin-to-force-quic-on=${origins.join(',')}`, `--ignore-certificate-errors-spki-list=${spki}`,
      '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1',
      'about:blank',
    ];
    const proc = spawn('taskset', ['-c', String(core), executable, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    // A benchmark that exits without close() (an error, Ctrl-C) leaves no browser behind.
    const onExit = (): void => {
      proc.kill('SIGKILL');
      rmSync(profileDir, { recursive: true, force: true });
    };
    process.once('exit', onExit);
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let err = '';
        const timer = setTimeout(() => reject(new Error(`chromium did not open its DevTools port within ${STEP_MS} ms: ${err.slice(-400)}`)), STEP_MS);
        proc.stderr?.on('data', (d: Buffer) => {
          err = (err + d.toString()).slice(-8000);
          const m = /DevTools listening on (ws:\/\/\S+)/.exec(err);
          if (m !== null) {
            clearTimeout(timer);
            resolve(m[1] as string);
          }
        });
        proc.once('exit', (code) => {
          clearTimeout(timer);
          reject(new Error(`chromium exited (${code}) before it was ready: ${err.slice(-400)}`));
        });
      });
      const ws = new WebSocket(url);
      await new Promise<void>((resolve, reject) => {
        ws.addEventListener('open', () => resolve(), { once: true });
        ws.addEventListener('error', () => reject(new Error('chromium: could not open the DevTools connection')), { once: true });
      });
      return new BrowserLoad(proc, ws, profileDir, onExit);
    } catch (err) {
      process.removeListener('exit', onExit);
      onExit();
      throw err;
    }
  }

  /** `n` requests shared by `concurrency` fetch loops on one fresh connection to `origin`. */
  async oneConnection(origin: string, n: number, concurrency: number): Promise<LoadResult> {
    const page = await this.openPage(origin);
    try {
      const r = await this.runFetches(page.session, n, concurrency);
      return toResult([page.load, r], n + 1, r.seconds);
    } finally {
      await this.closeContext(page.context);
    }
  }

  /**
   * `contexts` connections at once, each making `perContext` requests at once, `waves` times: each
   * context's connections are closed before every wave (`chrome.benchmarking.closeConnections`), so
   * every wave opens `contexts` new connections, full handshakes. req/s over the wall time of all
   * waves. The contexts and their pages are opened once per origin (their page loads are not
   * counted) and kept until `close()`.
   */
  async manyConnections(origin: string, contexts: number, perContext: number, waves: number): Promise<LoadResult> {
    let pages = this.pools.get(origin);
    if (pages === undefined || pages.length !== contexts) {
      if (pages !== undefined) await Promise.all(pages.map((p) => this.closeContext(p.context)));
      pages = await Promise.all(Array.from({ length: contexts }, () => this.openPage(origin)));
      this.pools.set(origin, pages);
    }
    const started = process.hrtime.bigint();
    const reports: PageReport[] = [];
    for (let w = 0; w < waves; w++) {
      reports.push(...(await Promise.all(pages.map((p) => this.runFetches(p.session, perContext, perContext, true)))));
    }
    return toResult(reports, contexts * perContext * waves, Number(process.hrtime.bigint() - started) / 1e9);
  }

  async close(): Promise<void> {
    const exited = new Promise<void>((resolve) => {
      if (this.proc.exitCode !== null || this.proc.signalCode !== null) resolve();
      else this.proc.once('exit', () => resolve());
    });
    try {
      await this.call('Browser.close', {}, undefined, 5_000);
    } catch {
      // Already gone, or not answering: killed below.
    }
    this.ws.close();
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
    process.removeListener('exit', this.onExit);
    rmSync(this.profileDir, { recursive: true, force: true });
  }

  /** A new browser context with one page loaded from `origin`; the load itself is one request, checked as the fetches are. */
  private async openPage(origin: string): Promise<{ context: string; session: string; load: PageReport }> {
    const { browserContextId } = (await this.call('Target.createBrowserContext', { disposeOnDetach: true })) as { browserContextId: string };
    try {
      const { targetId } = (await this.call('Target.createTarget', { url: 'about:blank', browserContextId })) as { targetId: string };
      const { sessionId } = (await this.call('Target.attachToTarget', { targetId, flatten: true })) as { sessionId: string };
      const t0 = performance.now();
      await this.evaluate(sessionId, `location.href = ${JSON.stringify(`https://${origin}/`)}`);
      // The navigation replaces the page's context: wait for the new document to finish loading.
      const load = await this.evaluateUntil(sessionId, `(() => { if (document.readyState !== 'complete' || location.origin !== ${JSON.stringify(`https://${origin}`)}) return null;
        const nav = performance.getEntriesByType('navigation')[0];
        return { status: nav ? nav.responseStatus : 0, protocol: nav ? nav.nextHopProtocol : '' }; })()`);
      const { status, protocol } = load as { status: number; protocol: string };
      const ok = status === 200 && protocol === 'h3';
      return { context: browserContextId, session: sessionId, load: { ok: ok ? 1 : 0, failed: status === 200 ? 0 : 1, notH3: protocol === 'h3' ? 0 : 1, seconds: 0, latencies: [performance.now() - t0] } };
    } catch (err) {
      await this.closeContext(browserContextId);
      throw err;
    }
  }

  /**
   * Runs `n` fetches of `/` in `concurrency` loops in the page; each must answer 200 over h3. With
   * `fresh`, the page's network context first closes its connections, so the fetches open a new one.
   */
  private async runFetches(session: string, n: number, concurrency: number, fresh = false): Promise<PageReport> {
    const expression = `(async () => {
      if (${fresh}) chrome.benchmarking.closeConnections();
      performance.clearResourceTimings();
      performance.setResourceTimingBufferSize(${n} + 16);
      let next = 0, ok = 0, failed = 0;
      const latencies = [];
      const t0 = performance.now();
      const loop = async () => {
        while (next < ${n}) {
          next++;
          const s = performance.now();
          try {
            const r = await fetch('/', { cache: 'no-store' });
            await r.arrayBuffer();
            if (r.status === 200) ok++; else failed++;
          } catch { failed++; }
          latencies.push(performance.now() - s);
        }
      };
      await Promise.all(Array.from({ length: ${concurrency} }, loop));
      const seconds = (performance.now() - t0) / 1000;
      const entries = performance.getEntriesByType('resource');
      const other = entries.filter((e) => e.nextHopProtocol !== 'h3');
      const notH3 = other.length + Math.max(0, ${n} - entries.length);
      return { ok, failed, notH3, seconds, latencies, protocols: [...new Set(other.map((e) => JSON.stringify(e.nextHopProtocol) + ' ' + e.responseStatus + ' ' + e.name))].slice(0, 4) };
    })()`;
    return (await this.evaluate(session, expression, 120_000)) as PageReport;
  }

  private async closeContext(browserContextId: string): Promise<void> {
    try {
      await this.call('Target.disposeBrowserContext', { browserContextId });
    } catch {
      // A context whose page failed to open may be gone already.
    }
  }

  private async evaluate(session: string, expression: string, timeoutMs = STEP_MS): Promise<unknown> {
    const r = (await this.call('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true }, session, timeoutMs)) as { result?: { value?: unknown }; exceptionDetails?: { text?: string; exception?: { description?: string } } };
    if (r.exceptionDetails !== undefined) throw new Error(`chromium: the page threw: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text ?? 'an exception'}`);
    return r.result?.value;
  }

  /** Evaluates `expression` until it returns something other than null (a navigation in progress may fail an evaluation). */
  private async evaluateUntil(session: string, expression: string): Promise<unknown> {
    const deadline = Date.now() + STEP_MS;
    let last = 'nothing yet';
    while (Date.now() < deadline) {
      try {
        const v = await this.evaluate(session, expression, 5_000);
        if (v !== null && v !== undefined) return v;
      } catch (err) {
        last = err instanceof Error ? err.message : String(err);
      }
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    throw new Error(`chromium: the page did not load within ${STEP_MS} ms (${last})`);
  }

  private call(method: string, params: Record<string, unknown>, sessionId?: string, timeoutMs = STEP_MS): Promise<Record<string, unknown>> {
    const id = ++this.nextId;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`chromium: ${method} did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, {
        resolve: (r) => {
          clearTimeout(timer);
          resolve(r);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.ws.send(JSON.stringify({ id, method, params, ...(sessionId === undefined ? {} : { sessionId }) }));
    });
  }

  private failAll(err: Error): void {
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
  }
}

/** Sums page reports into a load result: `asked` requests were meant to be made in `seconds`. */
function toResult(reports: readonly PageReport[], asked: number, seconds: number): LoadResult {
  const ok = reports.reduce((a, r) => a + r.ok, 0);
  const notH3 = reports.reduce((a, r) => a + r.notH3, 0);
  const failed = reports.reduce((a, r) => a + r.failed, 0);
  // The successes that did not come over h3 are not the load asked for: they count as errors.
  const requests = Math.max(0, ok - notH3);
  const lat = reports.flatMap((r) => r.latencies).sort((a, b) => a - b);
  return {
    requests,
    seconds,
    reqPerSec: seconds > 0 ? requests / seconds : 0,
    p50: percentile(lat, 0.5),
    p99: percentile(lat, 0.99),
    errors: asked - requests,
    raw: `chromium: ${ok} answered 200 of ${asked} asked, ${failed} failed, ${notH3} not over h3${notH3 > 0 ? ` (${[...new Set(reports.flatMap((r) => r.protocols ?? []))].slice(0, 4).join('; ')})` : ''}`,
  };
}
