// The two-phase activation protocol over the workers that serve (DESIGN "Generations"), with its
// one commit point (docs/decisions.md "Control plane: worker supervision"):
// - before commit is sent, any failure (a refusal, a worker that died or did not answer prepare,
//   one that prepared and died before commit) aborts everywhere: the candidate never served;
// - once commit is sent, the candidate is active as soon as one live worker acknowledged it, and
//   every worker that did not (dead, silent, refusing) is killed, to be re-forked on it;
// - if no live worker acknowledged, the active generation stays, and those workers are killed, to
//   be re-forked on it.
// The caller (the pool) owns the processes: it kills, re-forks and records the generation.
import type { RequestChannel } from '@edge-proxy/ipc';
import type { GenerationBundle, ToWorker } from '@edge-proxy/ipc';

type Req = Extract<ToWorker, { id: number }>;

/** What the protocol needs of one worker. */
export interface Participant {
  readonly index: number;
  readonly channel: RequestChannel<Req>;
  /** Dead, or being taken out by the supervisor. */
  gone(): boolean;
  /** SIGKILL; its exit re-forks it on whatever generation is active then. */
  kill(reason: 'ipc_timeout' | 'commit_failed'): void;
}

/** Result of an activation across workers. `replaced`: slots killed or lost on the way. */
export type ActivationOutcome =
  | { readonly ok: true; readonly note?: string; readonly replaced?: readonly number[] }
  | { readonly ok: false; readonly phase: 'prepare' | 'commit'; readonly code: string; readonly note: string; readonly replaced?: readonly number[] };

export function describeError(err: unknown): { code: string; message: string } {
  const e = err as { code?: unknown; message?: unknown };
  return { code: typeof e?.code === 'string' ? e.code : 'EDGE_WORKER_ERROR', message: typeof e?.message === 'string' ? e.message : String(err) };
}

/**
 * Runs prepare and commit of `bundle` on `members`. `acked` lists the workers that committed it
 * (empty unless the outcome is ok); `activeGeneration` only words the note of a failed commit.
 */
export async function twoPhase(members: readonly Participant[], bundle: GenerationBundle, phaseTimeoutMs: number, activeGeneration: number): Promise<{ outcome: ActivationOutcome; acked: readonly Participant[] }> {
  const replacedAmong = (): number[] => members.filter((m) => m.gone()).map((m) => m.index);
  if (members.length === 0) return { outcome: { ok: false, phase: 'prepare', code: 'EDGE_NO_WORKERS', note: 'no worker is running' }, acked: [] };
  const prepared = await Promise.allSettled(members.map((m) => m.channel.request({ type: 'prepare', bundle }, phaseTimeoutMs)));
  const problems: string[] = [];
  let code: string | undefined;
  prepared.forEach((r, i) => {
    const m = members[i] as Participant;
    if (r.status === 'rejected') {
      const e = describeError(r.reason);
      code ??= e.code;
      problems.push(`worker ${m.index}: ${e.message}`);
      // A worker that did not answer is frozen or broken: killed, re-forked on the active generation.
      if (e.code === 'EDGE_IPC_TIMEOUT') m.kill('ipc_timeout');
    } else if (m.gone()) {
      code ??= 'EDGE_IPC_CLOSED';
      problems.push(`worker ${m.index}: exited after it prepared, before commit`);
    }
  });
  if (problems.length > 0) {
    // Nothing was committed anywhere: abort everywhere; the active generation stays.
    await Promise.allSettled(
      members.map((m) =>
        m.channel.request({ type: 'abort', generation: bundle.generation }, phaseTimeoutMs).catch((err: unknown) => {
          if (describeError(err).code === 'EDGE_IPC_TIMEOUT') m.kill('ipc_timeout');
        }),
      ),
    );
    return { outcome: { ok: false, phase: 'prepare', code: code ?? 'EDGE_PREPARE_FAILED', note: problems.join('; '), replaced: replacedAmong() }, acked: [] };
  }
  // The commit point: from here a worker may serve the candidate.
  const committed = await Promise.allSettled(members.map((m) => m.channel.request({ type: 'commit', generation: bundle.generation }, phaseTimeoutMs)));
  const acked: Participant[] = [];
  const refused: string[] = [];
  let commitCode: string | undefined;
  committed.forEach((r, i) => {
    const m = members[i] as Participant;
    if (r.status === 'fulfilled' && !m.gone()) {
      acked.push(m);
      return;
    }
    const e = r.status === 'rejected' ? describeError(r.reason) : { code: 'EDGE_IPC_CLOSED', message: 'the worker exited' };
    commitCode ??= e.code;
    refused.push(`worker ${m.index} (${e.message})`);
    // Dead, silent or refusing: whatever it holds, it is replaced by a worker on the active generation.
    m.kill(e.code === 'EDGE_IPC_TIMEOUT' ? 'ipc_timeout' : 'commit_failed');
  });
  const replaced = replacedAmong();
  if (acked.length === 0) {
    // No surviving worker serves the candidate: it never became active.
    const note = `no worker committed generation ${bundle.generation}: ${refused.join('; ')}; re-forked on generation ${activeGeneration}`;
    return { outcome: { ok: false, phase: 'commit', code: commitCode ?? 'EDGE_COMMIT_FAILED', note, replaced }, acked: [] };
  }
  if (refused.length === 0) return { outcome: { ok: true }, acked };
  const note = `committed by worker ${acked.map((m) => m.index).join(', ')}; not by ${refused.join('; ')}: re-forked on generation ${bundle.generation}`;
  return { outcome: { ok: true, note, replaced }, acked };
}
