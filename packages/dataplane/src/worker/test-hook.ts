// TEST-ONLY: a way for end-to-end tests to hold a worker at a named step of the activation
// protocol, so that they can kill (SIGKILL) or stop (SIGSTOP) it in that exact window, or to make
// it refuse that step (test/activation-failure.test.ts). It is read from the environment only —
// never from the configuration — and does nothing unless `EDGE_TEST_PAUSE` or `EDGE_TEST_FAIL` is
// set:
//
//   EDGE_TEST_PAUSE=<step>:<worker index>:<generation>     step: prepare | commit
//   EDGE_TEST_FAIL=<step>:<worker indices>:<generation>    indices: `1`, or `0,1`
//
// PAUSE: the first process of that worker slot (a re-forked one never pauses) stops at `step` of
// that generation before acting on it, writes one JSON line `{"msg":"test hook: paused",...}` to
// stdout, and resumes on SIGUSR2.
// FAIL: the first process of each named slot answers `step` of that generation with the error
// code EDGE_TEST_REFUSED instead of acting on it (a commit that fails on a worker: the only way
// the commit-failure path of the two-phase protocol runs end to end). A re-forked process never
// refuses, so the slot can be brought back on whatever generation the supervisor settles on.
// With either variable set, every worker also writes a line for each activation step it passes
// (`test hook: step`; `prepared` and `committed` once the reply is on its way; `refused`), so a
// test can await "worker 0 prepared".
// docs/architecture.md "Test-only hooks" documents it; production units never set it.

export type HookStep = 'prepare' | 'prepared' | 'commit' | 'committed' | 'refused';
type PauseStep = 'prepare' | 'commit';

interface Pause {
  readonly step: 'prepare' | 'commit';
  readonly index: number;
  readonly generation: number;
}

interface Refusal {
  readonly step: PauseStep;
  readonly indices: readonly number[];
  readonly generation: number;
}

function parse(value: string | undefined): Pause | undefined {
  const m = /^(prepare|commit):(\d+):(\d+)$/.exec(value ?? '');
  if (m === null) return undefined;
  return { step: m[1] as Pause['step'], index: Number(m[2]), generation: Number(m[3]) };
}

function parseRefusal(value: string | undefined): Refusal | undefined {
  const m = /^(prepare|commit):(\d+(?:,\d+)*):(\d+)$/.exec(value ?? '');
  if (m === null) return undefined;
  return { step: m[1] as PauseStep, indices: (m[2] as string).split(',').map(Number), generation: Number(m[3]) };
}

export class TestHook {
  private readonly pause: Pause | undefined;
  private readonly refusal: Refusal | undefined;
  private readonly enabled: boolean;
  private readonly index: number;
  private readonly firstIncarnation: boolean;
  private resume: (() => void) | undefined;

  constructor(env: NodeJS.ProcessEnv = process.env) {
    const set = (name: string): boolean => env[name] !== undefined && env[name] !== '';
    this.enabled = set('EDGE_TEST_PAUSE') || set('EDGE_TEST_FAIL');
    this.pause = parse(env['EDGE_TEST_PAUSE']);
    this.refusal = parseRefusal(env['EDGE_TEST_FAIL']);
    this.index = Number(env['EDGE_WORKER_INDEX'] ?? -1);
    this.firstIncarnation = (env['EDGE_WORKER_INCARNATION'] ?? '0') === '0';
    // Without a handler SIGUSR2 would end the process; installed only when the pause is on.
    if (set('EDGE_TEST_PAUSE')) process.on('SIGUSR2', () => this.resume?.());
  }

  /**
   * Records `step` of `generation`; holds here until SIGUSR2 when it is the configured pause;
   * rejects with EDGE_TEST_REFUSED when it is the configured refusal (after the pause, if both).
   */
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
    const r = this.refusal;
    if (r !== undefined && this.firstIncarnation && r.step === step && r.indices.includes(this.index) && r.generation === generation) {
      this.line('test hook: step', 'refused', generation);
      throw Object.assign(new Error(`test hook: worker ${this.index} refuses ${step} of generation ${generation}`), { code: 'EDGE_TEST_REFUSED' });
    }
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
