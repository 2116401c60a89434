// The worker's own resident memory (worker/anonymous-memory.ts): RssAnon from /proc/self/status,
// which grows with what the process writes and leaves out the mapped binary its RSS includes.
import t from 'tap';
import { anonymousMemoryBytes, rssAnonBytes } from '../src/worker/anonymous-memory.ts';

const MiB = 1024 * 1024;

t.test('RssAnon parsed from a status text, in bytes; none without the field', async (t) => {
  t.equal(rssAnonBytes('VmRSS:\t  83136 kB\nRssAnon:\t   28296 kB\nRssFile:\t   54840 kB\n'), 28296 * 1024);
  t.equal(rssAnonBytes('VmRSS:\t  83136 kB\n'), undefined, 'no RssAnon line: undefined, not 0');
  t.equal(rssAnonBytes('XRssAnon:\t 5 kB\n'), undefined, 'a field that only ends with the name does not count');
});

t.test('this process: below its RSS by the mapped binary, and grows by what it writes', async (t) => {
  const before = anonymousMemoryBytes();
  if (before === undefined) return t.fail('/proc/self/status has no RssAnon (not Linux?)');
  const rss = process.memoryUsage.rss();
  t.ok(before < rss - 10 * MiB, `RssAnon ${(before / MiB).toFixed(1)} MiB is below RSS ${(rss / MiB).toFixed(1)} MiB by the file-backed pages`);
  const held = Buffer.alloc(64 * MiB, 1);
  const after = anonymousMemoryBytes() as number;
  const grown = (after - before) / MiB;
  t.ok(grown > 56 && grown < 80, `64 MiB written: RssAnon grew by ${grown.toFixed(1)} MiB`);
  t.equal(held.length, 64 * MiB);
});
