// The part of the worker's resident memory that is its own: `RssAnon` of /proc/self/status (its
// V8 and native heaps, thread stacks). RSS also counts the `node` binary's and the addons' pages,
// 55–60 MiB that every worker and the supervisor map from one copy, so for a node with many
// workers RSS overstates what each adds. The kernel keeps the counter, so reading it costs about
// 25 µs (smaps_rollup, which would also count private file pages, walks the page tables: 1.5 ms).

import { readFileSync } from 'node:fs';

const RSS_ANON = /^RssAnon:\s+(\d+) kB$/m;

/** RssAnon in bytes from the text of a /proc/<pid>/status, or undefined when it has none. */
export function rssAnonBytes(status: string): number | undefined {
  const m = RSS_ANON.exec(status);
  return m === null ? undefined : Number(m[1]) * 1024;
}

/** This process's anonymous resident memory, bytes; undefined where /proc has no such field (not Linux). */
export function anonymousMemoryBytes(): number | undefined {
  try {
    return rssAnonBytes(readFileSync('/proc/self/status', 'latin1'));
  } catch {
    return undefined;
  }
}
