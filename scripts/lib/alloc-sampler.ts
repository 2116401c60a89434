// Preloaded into a process by `bench:proxy --alloc-profile` (`node --import`): V8's sampling heap
// profiler, keeping the samples of objects already collected, so the profile counts every byte
// allocated (an estimate from one sample per `EDGE_ALLOC_INTERVAL` bytes, 4 KiB by default), not
// only what is still alive. SIGUSR2 starts sampling, the next SIGUSR2 stops it and writes the
// profile to `EDGE_ALLOC_OUT`; each step prints one JSON line on stdout for the benchmark.
import { Session } from 'node:inspector/promises';
import { writeFileSync } from 'node:fs';

const out = process.env['EDGE_ALLOC_OUT'];
if (out === undefined) throw new Error('alloc-sampler: EDGE_ALLOC_OUT (the profile file) is not set');
const interval = Number(process.env['EDGE_ALLOC_INTERVAL'] ?? 4096);
const session = new Session();
session.connect();
await session.post('HeapProfiler.enable');
let sampling = false;
process.on('SIGUSR2', () => {
  void (async (): Promise<void> => {
    if (!sampling) {
      sampling = true;
      await session.post('HeapProfiler.startSampling', { samplingInterval: interval, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true });
      console.log(JSON.stringify({ event: 'alloc-sampling' }));
      return;
    }
    sampling = false;
    const { profile } = await session.post('HeapProfiler.stopSampling');
    writeFileSync(out, JSON.stringify(profile));
    console.log(JSON.stringify({ event: 'alloc-written' }));
  })();
});
