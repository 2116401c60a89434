// Brownout: the SPEC state table as a pure transition, and the per-worker holder.
import t from 'tap';
import { Brownout, inflightPercent, nextBrownout, shedByBrownout } from '../src/resilience/brownout.ts';
import type { BrownoutPolicy } from '../src/resilience/brownout.ts';

const policy: BrownoutPolicy = { enabled: true, triggerInflightPercent: 90, recoverInflightPercent: 60 };

t.test('state table: inactive → active at percent ≥ trigger, active → inactive at percent ≤ recover', async (t) => {
  const cases: [active: boolean, percent: number, next: boolean, why: string][] = [
    [false, 0, false, 'idle'],
    [false, 89.99, false, 'just below the trigger'],
    [false, 90, true, 'exactly the trigger'],
    [false, 100, true, 'full'],
    [false, 150, true, 'above the limit (a lowered limit)'],
    [true, 100, true, 'stays active while full'],
    [true, 60.01, true, 'just above recover'],
    [true, 60, false, 'exactly recover'],
    [true, 0, false, 'idle'],
    // The hysteresis band (recover, trigger): the state is kept either way.
    [false, 61, false, 'band, inactive stays inactive'],
    [false, 75, false, 'band, inactive stays inactive'],
    [false, 89, false, 'band, inactive stays inactive'],
    [true, 61, true, 'band, active stays active'],
    [true, 75, true, 'band, active stays active'],
    [true, 89, true, 'band, active stays active'],
  ];
  for (const [active, percent, next, why] of cases) t.equal(nextBrownout(active, percent, 90, 60), next, `${active ? 'active' : 'inactive'} at ${percent} %: ${why}`);
});

t.test('inflightPercent is exact at integer ratios', async (t) => {
  t.equal(inflightPercent(180, 200), 90);
  t.equal(inflightPercent(3, 5), 60);
  t.equal(inflightPercent(58, 64) >= 90, true, '58 of 64 is 90.6 %');
  t.equal(inflightPercent(3686, 4096) < 90, true, '3686 of 4096 is 89.99 %');
  t.equal(inflightPercent(3687, 4096) >= 90, true);
  t.equal(inflightPercent(0, 0), 100, 'no limit counts as full');
  // Every boundary of every limit up to 1000 comes out exact.
  for (let limit = 1; limit <= 1000; limit++) {
    for (const pct of [60, 90]) {
      if ((limit * pct) % 100 !== 0) continue;
      if (inflightPercent((limit * pct) / 100, limit) !== pct) t.fail(`${pct} % of ${limit}`);
    }
  }
});

t.test('Brownout holder: sequence of samples against the limit in force', async (t) => {
  const b = new Brownout();
  const steps: [inflight: number, limit: number, active: boolean][] = [
    [100, 200, false],
    [179, 200, false],
    [180, 200, true], // 90 %
    [150, 200, true], // 75 %: band
    [121, 200, true],
    [120, 200, false], // 60 %
    [170, 200, false], // band again, from below
    // Adaptive admission lowered the limit to 64: 58 in flight is 90.6 % of it, though 1.4 % of 4096.
    [58, 64, true],
    [58, 4096, false],
  ];
  steps.forEach(([inflight, limit, active], i) => {
    t.equal(b.sample(inflight, limit, policy), active, `step ${i}: ${inflight}/${limit}`);
    t.equal(b.active, active);
  });
});

t.test('disabled: never active, and turning it off ends an active brownout', async (t) => {
  const b = new Brownout();
  t.equal(b.sample(200, 200, policy), true);
  t.equal(b.sample(200, 200, { ...policy, enabled: false }), false);
  t.equal(b.active, false);
  t.equal(b.sample(100, 200, policy), false, 're-enabled in the band: starts inactive');
  b.sample(200, 200, policy);
  b.reset();
  t.equal(b.active, false);
});

t.test('shedByBrownout: non-core routes shed; empty core_routes sheds every route', async (t) => {
  const core = new Set(['api', 'login']);
  t.equal(shedByBrownout('api', core), false);
  t.equal(shedByBrownout('static', core), true);
  t.equal(shedByBrownout('api', new Set()), true);
});
