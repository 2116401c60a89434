// TEST-ONLY: a way for end-to-end tests to hold a worker at a named step of the activation
// protocol, so that they can kill (SIGKILL) or stop (SIGSTOP) it in that exact window
// (test/worker-failure.test.ts). It is read from the environment only — never from the
// configuration — and does nothing unless `EDGE_TEST_PAUSE` is set:
//
//   EDGE_TEST_PAUSE=<step>:<worker index>:<generation>     step: prepare | commit
//
// The first process of that worker slot (a re-forked one never pauses) stops at `step` of that
// generation before acting on it, writes one JSON line `{"msg":"test hook: paused",...}` to
// stdout, and resumes on SIGUSR2. With the variable set, every worker also writes a line for
// each activation step it passes (`test hook: step`; `prepared` and `committed` once the reply is
// on its way), so a test can await "worker 0 prepared".
// docs/architecture.md "Test-only hooks" documents it; production units never set it.

export type HookStep = 'prepare' | 'prepared' | 'commit' | 'committed';
type PauseStep = 'prepare' | 'commit';

interface Pause {
  readonly step: 'prepare' | 'commit';
  readonly index: number;
  readonly generation: number;
}

function parse(value: string | undefined): Pause | undefined {
  const m = /^(prepare|commit):(\d+):(\d+)$/.exec(value ?? '');
  if (m === null) return undefined;
  return { step: m[1] as Pause['step'], index: Number(m[2]), generation: Number(m[3]) };
}

export class TestHook {
  private readonly pause: Pause | undefined;
  private readonly enabled: boolean;
  private readonly index: number;
  private readonly firstIncarnation: boolean;
  private resume: (() => void) | undefined;

  constructor(env: NodeJS.ProcessEnv = process.env) {
    this.enabled = env['EDGE_TEST_PAUSE'] !== undefined && env['EDGE_TEST_PAUSE'] !== '';
    this.pause = parse(env['EDGE_TEST_PAUSE']);
    this.index = Number(env['EDGE_WORKER_INDEX'] ?? -1);
    this.firstIncarnation = (env['EDGE_WORKER_INCARNATION'] ?? '0') === '0';
    // Without a handler SIGUSR2 would end the process; installed only when the hook is on.
    if (this.enabled) process.on('SIGUSR2', () => this.resume?.());
  }

  /** Records `step` of `generation`; holds here until SIGUSR2 when it is the configured pause. */
  async at(step: PauseStep, generation: number): Promise<void> {
    if (!this.enabled) return;
    const p = this.pause;
    if (p !== undefined && this.firstIncarnation && p.step === step && p.index === this.index && p.generation === generation) {
      const resumed = new Promise<void>((resolve) => (this.resume = resolve));
      this.line('test hook: paused', step, generation);
      await resumed;
      this.resume = undefined;
    }
    this.line('test hook: step', step, generation);
  }

  /**
   * Records that `step` of `generation` is done, once the reply to the supervisor has been handed
   * to the IPC channel (it is sent when the handler's promise settles, before `setImmediate` runs).
   */
  after(step: 'prepared' | 'committed', generation: number): void {
    if (this.enabled) setImmediate(() => this.line('test hook: step', step, generation));
  }

  private line(msg: string, step: HookStep, generation: number): void {
    process.stdout.write(`${JSON.stringify({ msg, step, worker: this.index, generation, pid: process.pid })}\n`);
  }
}
