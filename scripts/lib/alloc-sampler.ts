// Preloaded into a process by `bench:proxy --alloc-profile` (`node --import`): V8's sampling heap
// profiler, keeping the samples of objects already collected, so the profile counts every byte
// allocated (an estimate from one sample per `EDGE_ALLOC_INTERVAL` bytes, 4 KiB by default), not
// only what is still alive. With `EDGE_ALLOC_SURVIVORS=1` (bench:proxy --alloc-survivors) the
// samples of objects a young-generation collection freed are dropped: the profile counts what the
// young generation did not free, objects a scavenge copied and promoted, and objects V8 allocated in
// the old generation directly (it pretenures an allocation site whose objects often survive): the
// work of the scavenges and of the full collections. SIGUSR2 starts sampling, the next SIGUSR2
// stops it and writes the profile to `EDGE_ALLOC_OUT`; each step prints one JSON line on stdout for
// the benchmark.
import { Session } from 'node:inspector/promises';
import { writeFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

const out = process.env['EDGE_ALLOC_OUT'];
if (out === undefined) throw new Error('alloc-sampler: EDGE_ALLOC_OUT (the profile file) is not set');
const interval = Number(process.env['EDGE_ALLOC_INTERVAL'] ?? 4096);
const survivorsOnly = process.env['EDGE_ALLOC_SURVIVORS'] === '1';
const session = new Session();
session.connect();
await session.post('HeapProfiler.enable');
let sampling = false;

/** A young-generation collection now (V8's `gc({ type: 'minor' })`, exposed for this call alone). */
function minorGc(): void {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as (options: { type: 'minor' | 'major' }) => void;
  gc({ type: 'minor' });
}
process.on('SIGUSR2', () => {
  void (async (): Promise<void> => {
    if (!sampling) {
      sampling = true;
      await session.post('HeapProfiler.startSampling', { samplingInterval: interval, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: !survivorsOnly });
      console.log(JSON.stringify({ event: 'alloc-sampling' }));
      return;
    }
    sampling = false;
    // What died since the last scavenge is still in the young generation, and so still sampled:
    // one more scavenge first frees it, or up to two semi-spaces of garbage would count as survived.
    if (survivorsOnly) minorGc();
    const { profile } = await session.post('HeapProfiler.stopSampling');
    writeFileSync(out, JSON.stringify(profile));
    console.log(JSON.stringify({ event: 'alloc-written' }));
  })();
});
